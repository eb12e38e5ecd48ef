"""Public NSA kernels timed beside ours, in one process, on the same inputs (GPU only).

    PYTHONPATH=. python3 bench/peers.py [--shapes bench 125m] [--T 16384 65536] [--reps 20]
        [--peer-src DIR] [--out bench/results/peers_<device>.json] [--smoke]

Peers (a benchmark-only extra, ``pip install -e ".[peers]"``; never a package dependency, and
none of their code is copied here):

* ``fla`` -- fla-core's ``fla.ops.nsa`` (PyPI; PyTorch + Triton). Public entries:
  ``ParallelNSAFunction`` (selection attention, autograd) and ``parallel_nsa`` (its whole op:
  compression by *mean pooling* with l = d = l' = 64, its own top-n, selection; no window here,
  because its window needs ``flash_attn``, which the GPU image lacks -- so it is a different,
  cheaper op than ours and labelled so). Internal kernels: ``parallel_nsa_fwd`` /
  ``parallel_nsa_bwd`` (selection forward / backward from saved o, lse). It needs the query
  heads per KV group to be a power of two >= 16, so the 125M shape (h = 6) is recorded as
  unsupported.
* ``xunhao`` -- XunhaoLai/native-sparse-attention-triton, imported from a local checkout the
  user names with ``--peer-src DIR`` (not on PyPI). Public: ``topk_sparse_attention`` (selection,
  autograd) and ``compressed_attention`` (compressed attention + its scoring + top-n, forward;
  backward through autograd). Internal: ``_topk_sparse_attention_fwd/_bwd`` and
  ``_compressed_attention_fwd/_bwd``.

Every selection kernel gets the same block ids: ours (``select_blocks`` through the Pallas
scoring + top-n kernels), int32 [B,T,G,n] ascending with -1 in unused slots, converted to each
peer's layout (fla: the same [B,T,G,n]; xunhao: [G,T,n] varlen with cu_seqlens = [0, T]). A
bf16 check of each peer's selection output against ours on those ids is stored under ``check``
(relative RMSE), so a layout mistake cannot pass as a timing.

Ours (JAX): the selection forward/backward kernels (``selection_kernels`` with default
``KernelChoices``), ``nsa_attention(branches=[slc], block_idx=...)`` fwd+bwd as the public
selection entry, compressed attention fwd / +scoring+top-n / bwd kernels, and the whole
``nsa_attention(impl="pallas")`` fwd and fwd+bwd. Dense yardsticks: JAX cuDNN causal attention
(ours) and torch SDPA causal attention (default dispatch and the cuDNN backend), both GQA.

Timing: the same rule on both sides -- one call to compile / autotune, 3 warm-up calls, then
the median wall time of ``--reps`` (>= 20 unless --smoke) calls, each ended by
``block_until_ready`` (JAX) or ``torch.cuda.synchronize()`` (torch), alternating between two
input sets. For torch entries the median of CUDA-event times is stored too (``ms_events``).
B = 1, bf16, l=32, d=16, l'=64, n=16, w=512. The JSON is rewritten after every (shape, T); a
short table with ms and peer/ours ratios is printed last (ratio > 1: ours is faster).

JAX is told not to preallocate GPU memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, set below
for this process only) so that torch can allocate in the same process.
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = {"bench": (64, 4, 128), "125m": (12, 2, 64), "smoke": (32, 2, 64)}  # Hq, G, D
WARMUP = 3

# peer entry -> our entry it is compared with (same work on the same inputs unless said)
COUNTERPART = {
    "fla.internal.sel_fwd": "ours.sel_fwd", "fla.internal.sel_bwd": "ours.sel_bwd",
    "fla.public.sel_fwd": "ours.sel_fwd", "fla.public.sel_fwd_bwd": "ours.public.sel_fwd_bwd",
    "fla.public.nsa_fwd": "ours.nsa_fwd", "fla.public.nsa_fwd_bwd": "ours.nsa_fwd_bwd",
    "xunhao.internal.sel_fwd": "ours.sel_fwd", "xunhao.internal.sel_bwd": "ours.sel_bwd",
    "xunhao.public.sel_fwd": "ours.sel_fwd",
    "xunhao.public.sel_fwd_bwd": "ours.public.sel_fwd_bwd",
    "xunhao.internal.cmp_fwd": "ours.cmp_fwd", "xunhao.internal.cmp_bwd": "ours.cmp_bwd",
    "xunhao.public.cmp_score_topn_fwd": "ours.cmp_score_topn_fwd",
    "torch.sdpa_default.dense_fwd": "ours.jax_cudnn.dense_fwd",
    "torch.sdpa_default.dense_fwd_bwd": "ours.jax_cudnn.dense_fwd_bwd",
    "torch.sdpa_cudnn.dense_fwd_bwd": "ours.jax_cudnn.dense_fwd_bwd",
}
LABELS = {
    "fla.public.nsa_fwd": "fla parallel_nsa: mean-pool cmp (l=d=l'=64) + own top-n + selection, "
                          "no window -- a different op than ours",
    "fla.public.nsa_fwd_bwd": "same as fla.public.nsa_fwd, forward + backward",
    "xunhao.public.cmp_score_topn_fwd": "compressed_attention: cmp attention + scoring + top-n",
    "ours.public.sel_fwd_bwd": "nsa_attention(branches=[slc], block_idx) fwd+bwd, gates = 1",
    "ours.sel_fwd": "selection forward kernel (KernelChoices default: auto)",
    "ours.sel_bwd": "selection backward kernels from saved o, lse (index building included)",
    "ours.sel_bwd_ds": "the same with KernelChoices.sel_dq = 'ds' (opt-in: dQ from a stored dS)",
}
# our opt-in variants -> the peer entry each is set against (a second line per peer in the table)
OPTIONS = {"ours.sel_bwd_ds": ("xunhao.internal.sel_bwd", "fla.internal.sel_bwd")}


def need_peers():
    """torch + triton + fla-core, or one clear line and exit."""
    try:
        import torch
        import triton  # noqa: F401
        importlib.import_module("fla.ops.nsa.parallel")
    except Exception as e:  # ImportError, or a broken install
        sys.exit(f"bench/peers.py: needs torch, triton and fla-core (pip install -e '.[peers]', or "
                 f"the .whl folder on the device machine): {type(e).__name__}: {e}")
    if not torch.cuda.is_available() or jax.default_backend() != "gpu":
        sys.exit(f"bench/peers.py: needs a CUDA GPU for torch and JAX (torch.cuda.is_available()="
                 f"{torch.cuda.is_available()}, jax backend {jax.default_backend()!r})")


def load_xunhao(src):
    """(topk_sparse_attention module, compressed_attention module) from the checkout ``src``."""
    if not os.path.isdir(os.path.join(src, "native_sparse_attention")):
        sys.exit(f"bench/peers.py: --peer-src {src}: no native_sparse_attention/ package there")
    sys.path.insert(0, os.path.abspath(src))
    try:
        return (importlib.import_module("native_sparse_attention.ops.triton.topk_sparse_attention"),
                importlib.import_module("native_sparse_attention.ops.triton.compressed_attention"))
    except Exception as e:
        sys.exit(f"bench/peers.py: --peer-src {src}: import failed: {type(e).__name__}: {e}")


# ---- timing ---------------------------------------------------------------------------------
def time_jax(fn, argsets, reps):
    """Median wall ms of fn(*args), block_until_ready, alternating argument sets."""
    jax.block_until_ready(fn(*argsets[0]))  # compile
    for i in range(WARMUP):
        jax.block_until_ready(fn(*argsets[i % len(argsets)]))
    ts = []
    for i in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*argsets[i % len(argsets)]))
        ts.append(time.perf_counter() - t0)
    return {"ms": statistics.median(ts) * 1e3}


def time_torch(fn, argsets, reps):
    """Median wall ms (synchronize after each call) and median CUDA-event ms of fn(*args)."""
    import torch
    fn(*argsets[0])  # compile / autotune
    torch.cuda.synchronize()
    for i in range(WARMUP):
        fn(*argsets[i % len(argsets)])
    torch.cuda.synchronize()
    wall, ev = [], []
    for i in range(reps):
        a = argsets[i % len(argsets)]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        fn(*a)
        e1.record()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        ev.append(e0.elapsed_time(e1))
    return {"ms": statistics.median(wall) * 1e3, "ms_events": statistics.median(ev)}


def to_torch(x):
    """A JAX array as a torch tensor of its own (dlpack, else through float32 numpy)."""
    import torch
    try:
        return torch.from_dlpack(x).clone()
    except Exception:
        dt = {jnp.dtype(jnp.bfloat16): torch.bfloat16, jnp.dtype(jnp.float32): torch.float32,
              jnp.dtype(jnp.int32): torch.int32}[jnp.dtype(x.dtype)]
        host = np.asarray(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x)
        return torch.from_numpy(host).to("cuda").to(dt)


def xunhao_idx(idx):
    """Our block ids [B=1,T,G,n] -> the xunhao layout [G,T,n] (varlen, batch of one)."""
    if idx.shape[0] != 1:
        raise ValueError(f"idx: batch of one expected, got shape {tuple(idx.shape)}")
    return idx[0].permute(1, 0, 2).contiguous()


def _msg(e) -> str:
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def rrmse(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- one (shape, T) -------------------------------------------------------------------------
def bench_point(shape, T, reps, xunhao, log):
    import torch
    from fla.ops.nsa import parallel as fla_nsa

    from harness import CFG, make_inputs
    from nsa_jax.nsa import KernelChoices, nsa_attention
    from nsa_jax.pallas import BlockSizes, selection_kernels
    from nsa_jax.pallas.compressed import cmp_backward, cmp_forward
    from nsa_jax.pallas.scoring import cmp_block_scores
    from nsa_jax.pallas.selection import sel_backward
    from nsa_jax.pallas.topn import topn_pallas

    Hq, G, D = SHAPES[shape]
    h = Hq // G
    n, lsel = CFG.n_sel, CFG.sel_block
    scale = 1.0 / math.sqrt(D)
    bs, ch = BlockSizes.for_shape(h, D), KernelChoices()
    res, err, check = {}, {}, {}

    def run(name, timer, fn, argsets):
        try:
            res[name] = {k: round(v, 4) for k, v in timer(fn, argsets, reps).items()}
            log(f"  {name:36s} {res[name]['ms']:10.3f} ms")
        except Exception as e:  # one failing entry must not hide the others
            err[name] = _msg(e)
            log(f"  {name:36s} FAILED {err[name]}")

    # ---- inputs (two sets), our selection, and the torch copies
    sets = [make_inputs(s, T, Hq, G, D) for s in (0, 1)]  # q kc vc ks vs kw vw gates do
    select = jax.jit(lambda q, kc: topn_pallas(cmp_block_scores(
        q, kc, cmp_forward(q, kc, None, CFG, bs, scale, False)[1], CFG, bs, scale, False,
        choices=ch), CFG, False))
    idxs = [select(a[0], a[1]) for a in sets]
    jax.block_until_ready(idxs)

    # ---- ours (JAX)
    fwd, bwd = selection_kernels(ch, T)
    log(f"  (ours: selection kernels {fwd.__name__} / {bwd.__name__})")
    sel_f = jax.jit(lambda q, k, v, i: fwd(q, k, v, i, CFG, bs, scale, False))
    run("ours.sel_fwd", time_jax, sel_f, [(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)])
    fw = [sel_f(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)]
    sel_b = jax.jit(lambda q, k, v, i, o, lse, do: bwd(q, k, v, i, o, lse, do, None, CFG, bs,
                                                        scale, False, choices=ch))
    bargs = [(a[0], a[3], a[4], i, o, lse, a[8]) for a, i, (o, lse) in zip(sets, idxs, fw)]
    run("ours.sel_bwd", time_jax, sel_b, bargs)
    if bwd is sel_backward:        # the inverted backward: also with the opt-in dS variant
        ch_ds = dataclasses.replace(ch, sel_dq="ds")
        run("ours.sel_bwd_ds", time_jax, jax.jit(lambda q, k, v, i, o, lse, do: sel_backward(
            q, k, v, i, o, lse, do, None, CFG, bs, scale, False, choices=ch_ds)), bargs)
    del bargs
    slc_cfg = dataclasses.replace(CFG, branches=("slc",))
    ones = jnp.ones(sets[0][7].shape, sets[0][7].dtype)

    def slc_loss(q, k, v, i, do, a):
        out = nsa_attention(q, a[1], a[2], k, v, a[5], a[6], ones, slc_cfg, impl="pallas",
                            block_idx=i, choices=ch)
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    run("ours.public.sel_fwd_bwd", time_jax, jax.jit(jax.grad(slc_loss, argnums=(0, 1, 2))),
        [(a[0], a[3], a[4], i, a[8], a) for a, i in zip(sets, idxs)])
    cmp_f = jax.jit(lambda q, kc, vc: cmp_forward(q, kc, vc, CFG, bs, scale, False))
    run("ours.cmp_fwd", time_jax, cmp_f, [(a[0], a[1], a[2]) for a in sets])

    def cmp_all(q, kc, vc):
        o, lse = cmp_forward(q, kc, vc, CFG, bs, scale, False)
        return o, topn_pallas(cmp_block_scores(q, kc, lse, CFG, bs, scale, False, choices=ch),
                              CFG, False)
    run("ours.cmp_score_topn_fwd", time_jax, jax.jit(cmp_all), [(a[0], a[1], a[2]) for a in sets])
    cf = [cmp_f(a[0], a[1], a[2]) for a in sets]
    cmp_b = jax.jit(lambda q, kc, vc, o, lse, do: cmp_backward(
        q, kc, vc, o, lse, do, None, None, CFG, bs, scale, False, choices=ch))
    run("ours.cmp_bwd", time_jax, cmp_b,
        [(a[0], a[1], a[2], o, lse, a[8]) for a, (o, lse) in zip(sets, cf)])
    del cf
    run("ours.nsa_fwd", time_jax, jax.jit(lambda *a: nsa_attention(*a, CFG, impl="pallas",
                                                                   choices=ch)),
        [a[:8] for a in sets])

    def nsa_loss(*a):
        return jnp.sum(nsa_attention(*a[:8], CFG, impl="pallas", choices=ch).astype(jnp.float32)
                       * a[8].astype(jnp.float32))
    run("ours.nsa_fwd_bwd", time_jax, jax.jit(jax.grad(nsa_loss, argnums=tuple(range(8)))), sets)

    def dense(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def dense_loss(q, k, v, c):
        return jnp.sum(dense(q, k, v).astype(jnp.float32) * c.astype(jnp.float32))
    run("ours.jax_cudnn.dense_fwd", time_jax, jax.jit(dense), [(a[0], a[3], a[4]) for a in sets])
    run("ours.jax_cudnn.dense_fwd_bwd", time_jax, jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2))),
        [(a[0], a[3], a[4], a[8]) for a in sets])

    # ---- torch side: same arrays
    tsets = [dict(q=to_torch(a[0]), kc=to_torch(a[1]), vc=to_torch(a[2]), k=to_torch(a[3]),
                  v=to_torch(a[4]), g=to_torch(a[7]), do=to_torch(a[8]), idx=to_torch(i))
             for a, i in zip(sets, idxs)]
    our_o = [np.asarray(o[..., :D].astype(jnp.float32)) for o, _ in fw]
    del fw
    torch.cuda.synchronize()

    def grads_of(f, leaves, do):
        leaves = [x.detach().requires_grad_(True) for x in leaves]
        return torch.autograd.grad(f(*leaves), leaves, do)

    # dense: torch SDPA, [B,H,T,D], GQA
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dsets = [(t["q"].transpose(1, 2).contiguous(), t["k"].transpose(1, 2).contiguous(),
              t["v"].transpose(1, 2).contiguous(), t["do"].transpose(1, 2).contiguous())
             for t in tsets]

    def dense_t(q, k, v):
        return sdpa(q, k, v, is_causal=True, enable_gqa=True)
    with torch.no_grad():
        run("torch.sdpa_default.dense_fwd", time_torch, dense_t, [d[:3] for d in dsets])
    run("torch.sdpa_default.dense_fwd_bwd", time_torch,
        lambda q, k, v, do: grads_of(dense_t, (q, k, v), do), dsets)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        run("torch.sdpa_cudnn.dense_fwd_bwd", time_torch,
            lambda q, k, v, do: grads_of(dense_t, (q, k, v), do), dsets)
    del dsets

    # fla
    def fla_fwd(t):
        return fla_nsa.parallel_nsa_fwd(q=t["q"], k=t["k"], v=t["v"], block_indices=t["idx"],
                                        block_counts=n, block_size=lsel, scale=scale)
    try:
        for s, t in enumerate(tsets):
            o, lse = fla_fwd(t)
            t["fla_o"], t["fla_lse"] = o, lse
            if s == 0:
                check["fla.sel_fwd_vs_ours"] = rrmse(o.float().cpu().numpy(), our_o[0])
                log(f"  check fla selection output vs ours: rrmse "
                    f"{check['fla.sel_fwd_vs_ours']:.2e}")
    except Exception as e:
        err["fla.internal.sel_fwd"] = _msg(e)
        log(f"  fla selection unusable at this shape: {err['fla.internal.sel_fwd']}")
    if "fla.internal.sel_fwd" not in err:
        with torch.no_grad():
            run("fla.internal.sel_fwd", time_torch, fla_fwd, [(t,) for t in tsets])
            run("fla.internal.sel_bwd", time_torch, lambda t: fla_nsa.parallel_nsa_bwd(
                q=t["q"], k=t["k"], v=t["v"], o=t["fla_o"], lse=t["fla_lse"], do=t["do"],
                block_indices=t["idx"], block_counts=n, block_size=lsel, scale=scale),
                [(t,) for t in tsets])

            def fla_sel(q, k, v, t):
                return fla_nsa.ParallelNSAFunction.apply(q, k, v, t["idx"], n, lsel, scale, None)
            run("fla.public.sel_fwd", time_torch, lambda t: fla_sel(t["q"], t["k"], t["v"], t),
                [(t,) for t in tsets])
        run("fla.public.sel_fwd_bwd", time_torch, lambda t: grads_of(
            lambda q, k, v: fla_sel(q, k, v, t), (t["q"], t["k"], t["v"]), t["do"]),
            [(t,) for t in tsets])

        def fla_whole(q, k, v, gc, gs):
            return fla_nsa.parallel_nsa(q, k, v, g_cmp=gc, g_slc=gs, g_swa=None, block_counts=n,
                                        block_size=lsel, window_size=0, scale=scale)
        with torch.no_grad():
            run("fla.public.nsa_fwd", time_torch, lambda t: fla_whole(
                t["q"], t["k"], t["v"], t["g"][..., 0].contiguous(),
                t["g"][..., 1].contiguous()), [(t,) for t in tsets])
        run("fla.public.nsa_fwd_bwd", time_torch, lambda t: grads_of(
            fla_whole, (t["q"], t["k"], t["v"], t["g"][..., 0].contiguous(),
                        t["g"][..., 1].contiguous()), t["do"]), [(t,) for t in tsets])
        for t in tsets:
            t.pop("fla_o", None), t.pop("fla_lse", None)

    # xunhao (varlen [T, H, D], batch of one)
    if xunhao is not None:
        tsa, ca = xunhao
        Tc = CFG.num_cmp_blocks(T)
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        cu_c = torch.tensor([0, Tc], dtype=torch.int32, device="cuda")
        xsets = [dict(q=t["q"][0], k=t["k"][0], v=t["v"][0], kc=t["kc"][0], vc=t["vc"][0],
                      do=t["do"][0], idx=xunhao_idx(t["idx"])) for t in tsets]

        def bwd_after_fwd(name, fwd, saved, bwd):
            """Run ``fwd`` on every input set, keep its two outputs under ``saved``, time bwd."""
            try:
                for x in xsets:
                    x[saved[0]], x[saved[1]] = fwd(x)
                run(name, time_torch, bwd, [(x,) for x in xsets])
            except Exception as e:  # noqa: BLE001 - a peer's failure is recorded, not fatal
                err[name] = _msg(e)
        x_fwd = lambda x: tsa._topk_sparse_attention_fwd(  # noqa: E731
            x["q"], x["k"], x["v"], x["idx"], lsel, cu, cu, T, T, scale)
        try:
            o, _ = x_fwd(xsets[0])
            check["xunhao.sel_fwd_vs_ours"] = rrmse(o.float().cpu().numpy()[None], our_o[0])
            log(f"  check xunhao selection output vs ours: rrmse "
                f"{check['xunhao.sel_fwd_vs_ours']:.2e}")
        except Exception as e:
            log(f"  xunhao check failed: {_msg(e)}")
        with torch.no_grad():
            run("xunhao.internal.sel_fwd", time_torch, x_fwd, [(x,) for x in xsets])
            bwd_after_fwd("xunhao.internal.sel_bwd", x_fwd, ("o", "lse"),
                          lambda x: tsa._topk_sparse_attention_bwd(
                              x["o"], x["do"], x["lse"], x["q"], x["k"], x["v"], x["idx"], lsel,
                              cu, cu, T, T, scale))
            run("xunhao.public.sel_fwd", time_torch, lambda x: tsa.topk_sparse_attention(
                x["q"], x["k"], x["v"], x["idx"], lsel, cu, scale), [(x,) for x in xsets])
        run("xunhao.public.sel_fwd_bwd", time_torch, lambda x: grads_of(
            lambda q, k, v: tsa.topk_sparse_attention(q, k, v, x["idx"], lsel, cu, scale),
            (x["q"], x["k"], x["v"]), x["do"]), [(x,) for x in xsets])
        l_, d_ = CFG.block_l, CFG.stride_d
        c_fwd = lambda x: ca._compressed_attention_fwd(  # noqa: E731
            x["q"], x["kc"], x["vc"], l_, d_, cu, cu_c, T, Tc, scale)
        with torch.no_grad():
            run("xunhao.internal.cmp_fwd", time_torch, c_fwd, [(x,) for x in xsets])
            bwd_after_fwd("xunhao.internal.cmp_bwd", c_fwd, ("co", "clse"),
                          lambda x: ca._compressed_attention_bwd(
                              x["co"], x["do"], x["clse"], x["q"], x["kc"], x["vc"], l_, d_, cu,
                              cu_c, T, Tc, scale))
            run("xunhao.public.cmp_score_topn_fwd", time_torch, lambda x: ca.compressed_attention(
                x["q"], x["kc"], x["vc"], l_, d_, lsel, n, cu, cu_c, T, Tc, scale,
                CFG.n_init, CFG.n_local), [(x,) for x in xsets])
        del xsets
    del tsets
    torch.cuda.empty_cache()
    ratios = {k: round(res[k]["ms"] / res[v]["ms"], 3) for k, v in COUNTERPART.items()
              if k in res and v in res and res[v]["ms"] > 0}
    ratios.update({f"{peer}@{ours}": round(res[peer]["ms"] / res[ours]["ms"], 3)
                   for ours, peers in OPTIONS.items() for peer in peers
                   if ours in res and peer in res and res[ours]["ms"] > 0})
    return {"shape": shape, "Hq": Hq, "G": G, "D": D, "T": T, "B": 1, "ms": res,
            "ratio_peer_over_ours": ratios, "errors": err, "check": check}


def print_table(results):
    print("\npeer / ours (ratio > 1: ours faster); ms = median wall time")
    print(f"{'shape':6s} {'T':>6s} {'entry':36s} {'ms':>10s}  {'ours entry':28s} {'ours ms':>9s} "
          f"{'ratio':>7s}")
    for r in results:
        for name, v in sorted(r["ms"].items()):
            if name.startswith("ours."):
                continue
            o = COUNTERPART.get(name)
            om = r["ms"].get(o, {}).get("ms") if o else None
            ratio = r["ratio_peer_over_ours"].get(name)
            print(f"{r['shape']:6s} {r['T']:6d} {name:36s} {v['ms']:10.3f}  {o or '-':28s} "
                  f"{om if om is not None else float('nan'):9.3f} "
                  f"{ratio if ratio is not None else float('nan'):7.3f}")
        for ours, peers in OPTIONS.items():
            for name in peers:
                ratio = r["ratio_peer_over_ours"].get(f"{name}@{ours}")
                if ratio is not None:
                    print(f"{r['shape']:6s} {r['T']:6d} {name:36s} {r['ms'][name]['ms']:10.3f}  "
                          f"{ours:28s} {r['ms'][ours]['ms']:9.3f} {ratio:7.3f}")
        for name, e in sorted(r["errors"].items()):
            print(f"{r['shape']:6s} {r['T']:6d} {name:36s} {'failed':>10s}  {e[:60]}")
        for name, c in sorted(r["check"].items()):
            print(f"{r['shape']:6s} {r['T']:6d} check {name:30s} rrmse {c:.2e}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["bench", "125m"], choices=sorted(SHAPES))
    p.add_argument("--T", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--peer-src", help="local checkout of XunhaoLai/native-sparse-attention-triton")
    p.add_argument("--out", help="JSON path (default bench/results/peers_<device>.json)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes (smoke h=16 and 125m, T=1000), 3 reps: does every entry run")
    a = p.parse_args(argv)
    need_peers()
    import torch
    import triton
    xunhao = load_xunhao(a.peer_src) if a.peer_src else None
    if a.smoke:
        a.shapes, a.T, a.reps = ["smoke", "125m"], [1000], 3
    elif a.reps < 20:
        p.error("--reps: at least 20 timed calls (use --smoke for a quick run)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py
    dev = jax.devices()[0].device_kind
    out = a.out or os.path.join("bench", "results",
                                f"peers_{dev.split()[-1].lower()}.json")
    import fla
    doc = {"device": dev, "jax": jax.__version__, "torch": torch.__version__,
           "triton": triton.__version__, "fla_core": getattr(fla, "__version__", "?"),
           "xunhao_src": os.path.abspath(a.peer_src) if a.peer_src else None,
           "python": platform.python_version(), "dtype": "bfloat16", "reps": a.reps,
           "stat": "median wall ms per call (block_until_ready / cuda synchronize); torch also "
                   "median CUDA-event ms", "labels": LABELS, "counterparts": COUNTERPART,
           "results": []}
    log = lambda s: print(s, flush=True)  # noqa: E731
    for shape in a.shapes:
        for T in a.T:
            log(f"== {shape} {SHAPES[shape]} T={T}")
            t0 = time.time()
            doc["results"].append(bench_point(shape, T, a.reps, xunhao, log))
            log(f"   ({time.time() - t0:.0f} s)")
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)
    print_table(doc["results"])
    print(f"(JSON: {out})")


if __name__ == "__main__":
    main()
