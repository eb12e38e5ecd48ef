"""Benchmark of the NSA Pallas kernels against cuDNN dense attention (GPU).

    PYTHONPATH=. python3 bench/kernels.py --out bench/results/kernels_h200.json [--T 8192 65536]
        [--shapes bench 125m] [--reps 20]

For each head shape and sequence length (B=1, bf16, l=32, d=16, l'=64, n=16, w=512) it times, in
one process: selection attention fwd and bwd (both dK/dV strategies); compressed attention +
fused scoring + top-n fwd and the compressed backward; the sliding window fwd+bwd (cuDNN); the
whole ``nsa_attention(impl="pallas")`` fwd and fwd+bwd; cuDNN dense causal attention fwd and
fwd+bwd on the same q / k_slc / v_slc. Each number is the median wall time of ``--reps`` calls
(block_until_ready) after a compile call and warm-up calls, alternating between two input sets
so repeated calls do not just re-read L2. The JSON is rewritten after every (shape, T).

Selection kernels, gather vs tiled (``KernelChoices.sel_impl``), at a fixed number of tokens per
batch (B = --tokens / T; 32768 = the 125M training batch of 16 x 2048):

    PYTHONPATH=. python3 bench/kernels.py --sel-impl gather tiled --T 2048 4096 8192 16384
        --shapes 125m --tokens 32768 [--sel-tile-q 64 128] --out bench/results/sel_impl_h200.json

times the selection forward, its backward (dQ + dK/dV, index building included) and the whole
``nsa_attention(impl="pallas")`` fwd+bwd with each implementation (block ids from the kernels'
own top-n on random inputs), and cuDNN dense causal fwd+bwd; for the tiled kernels also the
backward's parts (``tile_index``, the dQ kernel, the dK/dV kernel); key ``sel_impl`` in the JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp

from nsa_jax.nsa import KernelChoices, nsa_attention
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes, selection_kernels
from nsa_jax.pallas.compressed import cmp_backward, cmp_forward
try:  # an older tree (PYTHONPATH=.old/...) kept the scoring kernel in compressed.py
    from nsa_jax.pallas.scoring import cmp_block_scores
except ImportError:
    from nsa_jax.pallas.compressed import cmp_block_scores
from nsa_jax.pallas.common import dot_precision, fold_gate
from nsa_jax.pallas.selection import inverted_index, sel_backward, sel_dq, sel_forward
from nsa_jax.pallas.selection_tiled import (sel_tiled_backward, sel_tiled_bwd_dkv,
                                             sel_tiled_bwd_dq, sel_tiled_forward)
from nsa_jax.pallas.tiled_index import tile_index
from nsa_jax.pallas.topn import topn_pallas
from nsa_jax.pallas.window import window_attention

from harness import CFG, INTERP, SHAPES, fields, make_inputs, setup, timed


def flops(T, Hq, D, cfg=CFG):
    """Matmul FLOPs (2 per multiply-add) of the forward passes, causal work only."""
    n_keys_sel = cfg.n_sel * cfg.sel_block
    Tc = cfg.num_cmp_blocks(T)
    vis_cmp = sum(min(Tc, max(0, (t - cfg.block_l + 1) // cfg.stride_d + 1)) for t in
                  range(0, T, 64)) * 64  # sum_t visible compressed blocks (sampled every 64)
    win = sum(min(t + 1, cfg.window) for t in range(T))
    return {"sel_fwd": 4 * Hq * D * T * n_keys_sel, "cmp_fwd": 4 * Hq * D * vis_cmp,
            "win_fwd": 4 * Hq * D * win, "dense_fwd": 4 * Hq * D * T * (T + 1) // 2}


def bench_one(shape, T, reps, log):
    Hq, G, D, bs, scale, sets = setup(shape, T)
    res = {}

    def run(name, fn, argsets, reps_=reps):
        try:
            res[name] = round(timed(fn, argsets, reps_), 4)
        except Exception as e:  # keep going: one failing kernel must not hide the others
            res[name] = None
            log(f"  {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            return
        log(f"  {name:28s} {res[name]:10.3f} ms")

    select = jax.jit(lambda q, kc: topn_pallas(
        cmp_block_scores(q, kc, cmp_forward(q, kc, None, CFG, bs, scale, INTERP)[1], CFG, bs,
                         scale, INTERP), CFG, INTERP))
    idxs = [select(a[0], a[1]) for a in sets]
    jax.block_until_ready(idxs)

    # selection attention
    sel_f = jax.jit(lambda q, k, v, i: sel_forward(q, k, v, i, CFG, bs, scale, INTERP))
    run("sel_fwd", sel_f, [(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)])
    fw = [sel_f(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)]
    run("sel_index", jax.jit(lambda i: inverted_index(i, T, CFG.num_sel_blocks(T), 256,
                                                      CFG.sel_block)),
        [(i,) for i in idxs])
    for mode in ("inverted", "atomic"):
        chm = KernelChoices(sel_bwd=mode)
        sel_b = jax.jit(lambda q, k, v, i, o, lse, do, gs, chm=chm: sel_backward(
            q, k, v, i, o, lse, do, gs, CFG, bs, scale, INTERP, choices=chm))
        run(f"sel_bwd_{mode}", sel_b, [(a[0], a[3], a[4], i, o, lse, a[8], a[7][..., 1])
                                       for a, i, (o, lse) in zip(sets, idxs, fw)])

    # compressed attention + scoring + top-n
    cmp_f = jax.jit(lambda q, kc, vc: cmp_forward(q, kc, vc, CFG, bs, scale, INTERP))
    run("cmp_fwd", cmp_f, [(a[0], a[1], a[2]) for a in sets])
    cf = [cmp_f(a[0], a[1], a[2]) for a in sets]
    score = jax.jit(lambda q, kc, lse: cmp_block_scores(q, kc, lse, CFG, bs, scale, INTERP))
    run("cmp_scores", score, [(a[0], a[1], lse) for a, (_, lse) in zip(sets, cf)])
    sc = [score(a[0], a[1], lse) for a, (_, lse) in zip(sets, cf)]
    run("topn", jax.jit(lambda s: topn_pallas(s, CFG, INTERP)), [(s,) for s in sc])
    run("topn_xla", jax.jit(lambda s: ref.topn_from_scores(s, CFG)), [(s,) for s in sc])
    del sc

    def cmp_all(q, kc, vc):
        o, lse = cmp_forward(q, kc, vc, CFG, bs, scale, INTERP)
        return o, topn_pallas(cmp_block_scores(q, kc, lse, CFG, bs, scale, INTERP), CFG, INTERP)
    run("cmp_score_topn_fwd", jax.jit(cmp_all), [(a[0], a[1], a[2]) for a in sets])
    cmp_b = jax.jit(lambda q, kc, vc, o, lse, do, gs: cmp_backward(
        q, kc, vc, o, lse, do, gs, None, CFG, bs, scale, INTERP))
    run("cmp_bwd", cmp_b, [(a[0], a[1], a[2], o, lse, a[8], a[7][..., 0])
                           for a, (o, lse) in zip(sets, cf)])
    del cf, fw

    # sliding window (cuDNN)
    def win_loss(q, k, v, c):
        return jnp.sum(window_attention(q, k, v, CFG, INTERP) * c.astype(jnp.float32))
    run("win_fwd", jax.jit(lambda q, k, v: window_attention(q, k, v, CFG, INTERP)),
        [(a[0], a[5], a[6]) for a in sets])
    run("win_fwd_bwd", jax.jit(jax.grad(win_loss, argnums=(0, 1, 2))),
        [(a[0], a[5], a[6], a[8]) for a in sets])

    # whole NSA
    nsa_f = jax.jit(lambda *a: nsa_attention(*a, CFG, impl="pallas"))
    run("nsa_fwd", nsa_f, [a[:8] for a in sets])

    def nsa_loss(*a):
        return jnp.sum(nsa_attention(*a[:8], CFG, impl="pallas").astype(jnp.float32)
                       * a[8].astype(jnp.float32))
    run("nsa_fwd_bwd", jax.jit(jax.grad(nsa_loss, argnums=tuple(range(8)))), sets)

    # cuDNN dense causal attention on the same q / k / v
    def dense(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def dense_loss(q, k, v, c):
        return jnp.sum(dense(q, k, v).astype(jnp.float32) * c.astype(jnp.float32))
    run("dense_fwd", jax.jit(dense), [(a[0], a[3], a[4]) for a in sets])
    run("dense_fwd_bwd", jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2))),
        [(a[0], a[3], a[4], a[8]) for a in sets])

    r = {"shape": shape, "Hq": Hq, "G": G, "D": D, "T": T, "ms": res, "flops": flops(T, Hq, D),
         "block_sizes": dataclasses.asdict(bs), "choices": dataclasses.asdict(KernelChoices())}
    nf, df = res.get("nsa_fwd_bwd"), res.get("dense_fwd_bwd")
    if nf and df:
        r["speedup_fwd_bwd_vs_dense"] = round(df / nf, 3)
    return r


def smoke(log):
    """Compile every kernel once at a small odd shape and compare with the float32 reference,
    each in its own try block so one call reports every compile error."""
    import traceback
    T, Hq, G, D = 1000, 8, 2, 64
    bs = BlockSizes.for_shape(Hq // G, D)
    scale = 1.0 / math.sqrt(D)
    a = make_inputs(11, T, Hq, G, D)
    f = [x.astype(jnp.float32) for x in a]
    rel = lambda x, y: float(jnp.linalg.norm(jnp.asarray(x, jnp.float32) - y) / jnp.linalg.norm(y))
    idx = ref.select_blocks(f[0], f[1], CFG)
    B = 1

    def check(name, fn):
        try:
            log(f"  {name:24s} ok  {fn()}")
        except Exception:
            log(f"  {name:24s} FAILED\n" + traceback.format_exc()[-4000:])

    check("sel_fwd", lambda: rel(sel_forward(a[0], a[3], a[4], idx, CFG, bs, scale, INTERP)[0],
                                 ref.selection_attention(f[0], f[3], f[4], idx, CFG)))
    o, lse = sel_forward(a[0], a[3], a[4], idx, CFG, bs, scale, INTERP)
    do = a[8].astype(jnp.float32)
    gs = a[7][..., 1].astype(jnp.float32)
    _, vjp = jax.vjp(lambda q, k, v: ref.selection_attention(q, k, v, idx, CFG), f[0], f[3], f[4])
    rg = vjp(do * gs[..., None])
    for mode in ("inverted", "atomic"):
        chm = KernelChoices(sel_bwd=mode)
        check(f"sel_bwd_{mode}", lambda chm=chm: [rel(x, y) for x, y in zip(sel_backward(
            a[0], a[3], a[4], idx, o, lse, a[8], gs, CFG, bs, scale, INTERP, choices=chm), rg)])
    check("sel_tiled_fwd", lambda: rel(sel_tiled_forward(a[0], a[3], a[4], idx, CFG, bs, scale,
                                                         INTERP)[0],
                                       ref.selection_attention(f[0], f[3], f[4], idx, CFG)))
    to, tl = sel_tiled_forward(a[0], a[3], a[4], idx, CFG, bs, scale, INTERP)
    check("sel_tiled_bwd", lambda: [rel(x, y) for x, y in zip(sel_tiled_backward(
        a[0], a[3], a[4], idx, to, tl, a[8], gs, CFG, bs, scale, INTERP), rg)])
    check("cmp_fwd", lambda: rel(cmp_forward(a[0], a[1], a[2], CFG, bs, scale, INTERP)[0],
                                 ref.compressed_attention(f[0], f[1], f[2], CFG)))
    check("cmp_lse", lambda: rel(cmp_forward(a[0], a[1], None, CFG, bs, scale, INTERP)[1][:, 64:],
                                 cmp_forward(a[0], a[1], a[2], CFG, bs, scale, INTERP)[1][:, 64:]))
    oc, lc = cmp_forward(a[0], a[1], a[2], CFG, bs, scale, INTERP)
    check("cmp_scores", lambda: rel(cmp_block_scores(a[0], a[1], lc, CFG, bs, scale, INTERP),
                                    ref.block_scores(ref.cmp_probs(f[0], f[1], CFG), T, CFG)))
    _, vjp = jax.vjp(lambda q, k, v: ref.compressed_attention(q, k, v, CFG), f[0], f[1], f[2])
    rg = vjp(do * gs[..., None])
    for split in (1, 4):
        chs = KernelChoices(cmp_bwd_split=split)
        check(f"cmp_bwd_split{split}", lambda chs=chs: [rel(x, y) for x, y in zip(cmp_backward(
            a[0], a[1], a[2], oc, lc, a[8], gs, None, CFG, bs, scale, INTERP, choices=chs), rg)])
    check("window_fwd", lambda: rel(window_attention(a[0], a[5], a[6], CFG, INTERP),
                                    ref.window_attention(f[0], f[5], f[6], CFG)))
    def nsa_grads(impl, args):
        fn = lambda *x: nsa_attention(*x, CFG, impl=impl, block_idx=idx)
        o, vjp = jax.vjp(fn, *args[:8])
        return [o] + list(vjp(args[8].astype(o.dtype)))
    check("nsa_fwd_bwd", lambda: [round(rel(x, y), 5) for x, y in zip(
        nsa_grads("pallas", a), nsa_grads("reference", f))])
    del B


def _tiled_name(bq, var):
    short = {"num_warps": "w", "num_stages": "s", "sel_keys": "k"}
    return f"tiled{bq}" + "".join(f"_{short.get(k, k)}{v}" for k, v in var.items())


def bench_sel_impls(shape, T, B, impls, tile_qs, reps, log, tiled_vars=({},)):
    """Selection fwd, bwd and whole-NSA fwd+bwd per selection implementation at (shape, T, B);
    the tiled kernels once per query tile size and ``tiled_vars`` entry (BlockSizes fields)."""
    Hq, G, D = SHAPES[shape]
    base = BlockSizes.for_shape(Hq // G, D)
    scale = 1.0 / math.sqrt(D)
    variants = []
    for impl in impls:
        if impl == "tiled":
            variants += [(_tiled_name(bq, var), dataclasses.replace(base, sel_tile_q=bq, **var),
                          KernelChoices(sel_impl="tiled")) for bq in tile_qs
                         for var in tiled_vars]
        else:
            variants.append((impl, base, KernelChoices(sel_impl=impl)))
    sets = [make_inputs(s_, T, Hq, G, D, B=B) for s_ in (0, 1)]
    select = jax.jit(lambda q, kc: topn_pallas(
        cmp_block_scores(q, kc, cmp_forward(q, kc, None, CFG, base, scale, INTERP)[1], CFG, base,
                         scale, INTERP), CFG, INTERP))
    idxs = [select(a[0], a[1]) for a in sets]
    jax.block_until_ready(idxs)
    rows = []

    def run(res, name, fn, argsets):
        try:
            res[name] = round(timed(fn, argsets, reps), 4)
        except Exception as e:  # keep going: one failing variant must not hide the others
            res[name] = None
            log(f"  {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            return
        log(f"  {name:20s} {res[name]:10.3f} ms")

    for name, bs, ch in variants:
        log(f" {shape} T={T} B={B} sel_impl={name}")
        res = {}
        fwd, bwd = selection_kernels(ch, T)
        sel_f = jax.jit(lambda q, k, v, i, fwd=fwd, bs=bs: fwd(q, k, v, i, CFG, bs, scale, INTERP))
        run(res, "sel_fwd", sel_f, [(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)])
        fw = [sel_f(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)]
        sel_b = jax.jit(lambda q, k, v, i, o, lse, do, gs, bwd=bwd, bs=bs, ch=ch: bwd(
            q, k, v, i, o, lse, do, gs, CFG, bs, scale, INTERP, choices=ch))
        run(res, "sel_bwd", sel_b, [(a[0], a[3], a[4], i, o, lse, a[8], a[7][..., 1])
                                    for a, i, (o, lse) in zip(sets, idxs, fw)])
        if ch.sel_impl == "tiled":  # the backward's parts: index, dQ kernel, dK/dV kernel
            index = jax.jit(lambda i, bs=bs: tile_index(i, T, CFG, bs.sel_tile_q))
            run(res, "tile_index", index, [(i,) for i in idxs])
            lists = [index(i) for i in idxs]
            # dQ takes the gate as a row operand, dK/dV folded into lse (sel_tiled_backward)
            def row_args(a, o, lse):
                gs = a[7][..., 1].astype(jnp.float32)
                return (gs, lse, gs * jnp.sum(o * a[8].astype(jnp.float32), axis=-1),
                        *fold_gate(lse, gs, o, a[8]))
            parts = [(a[0], a[3], a[4], i, a[8], *row_args(a, o, lse), ls)
                     for a, i, (o, lse), ls in zip(sets, idxs, fw, lists)]
            dq_f = jax.jit(lambda q, k, v, i, do, gs, lse, dl, lf, df, ls, bs=bs: sel_tiled_bwd_dq(
                q, k, v, i, ls[0], ls[1], do, gs, lse, dl, CFG, bs, scale, INTERP))
            dkv_f = jax.jit(lambda q, k, v, i, do, gs, lse, dl, lf, df, ls, bs=bs:
                            sel_tiled_bwd_dkv(q, k, v, i, ls[2], ls[3], do, lf, df, CFG, bs,
                                              scale, INTERP))
            run(res, "bwd_dq", dq_f, parts)
            run(res, "bwd_dkv", dkv_f, parts)
            del parts, lists
        del fw

        def nsa_loss(*a, bs=bs, ch=ch):
            return jnp.sum(nsa_attention(*a[:8], CFG, impl="pallas", block_sizes=bs, choices=ch)
                           .astype(jnp.float32) * a[8].astype(jnp.float32))
        run(res, "nsa_fwd_bwd", jax.jit(jax.grad(nsa_loss, argnums=tuple(range(8)))), sets)
        rows.append({"shape": shape, "T": T, "B": B, "sel_impl": name, "ms": res,
                     "block_sizes": dataclasses.asdict(bs), "choices": dataclasses.asdict(ch)})

    def dense_loss(q, k, v, c):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))
    res = {}
    run(res, "dense_fwd_bwd", jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2))),
        [(a[0], a[3], a[4], a[8]) for a in sets])
    for r in rows:
        r["ms"]["dense_fwd_bwd"] = res.get("dense_fwd_bwd")
    return rows


def print_sel_table(rows):
    """ms per column; x_sel / x_nsa: gather time / this row's time (selection fwd+bwd, whole
    NSA fwd+bwd) at the same (shape, T)."""
    cols = {"sel_fwd": "sel_fwd", "sel_bwd": "sel_bwd", "tile_index": "index",
            "bwd_dq": "bwd_dq", "bwd_dkv": "bwd_dkv", "nsa_fwd_bwd": "nsa_f+b",
            "dense_fwd_bwd": "dense_f+b"}
    print("shape      T   B sel_impl " + " ".join(f"{c:>9s}" for c in cols.values())
          + "  x_sel  x_nsa")
    gather = {(r["shape"], r["T"]): r["ms"] for r in rows if r["sel_impl"] == "gather"}
    for r in rows:
        ms, g = r["ms"], gather.get((r["shape"], r["T"]), {})
        vals = " ".join(f"{ms[c] if ms.get(c) is not None else float('nan'):9.3f}"
                        for c in cols)
        tot = (ms.get("sel_fwd") or 0) + (ms.get("sel_bwd") or 0)
        gtot = (g.get("sel_fwd") or 0) + (g.get("sel_bwd") or 0)
        x_sel = f"{gtot / tot:5.2f}x" if tot and gtot else "    -"
        x_nsa = f"{g['nsa_fwd_bwd'] / ms['nsa_fwd_bwd']:5.2f}x" \
            if ms.get("nsa_fwd_bwd") and g.get("nsa_fwd_bwd") else "    -"
        print(f"{r['shape']:6s} {r['T']:6d} {r['B']:3d} {r['sel_impl']:8s} {vals}  {x_sel} "
              f"{x_nsa}")


SWEEP = {  # kernel group -> BlockSizes / KernelChoices variants (first = current default)
    "sel_fwd": [{}, {"sel_warps": 1}, {"sel_warps": 4}, {"sel_stages": 1}, {"sel_stages": 3},
                {"sel_q_keys": 32}],
    "sel_bwd": [{}, {"sel_warps": 1}, {"sel_warps": 4}, {"sel_stages": 3}, {"sel_rows": 64}],
    "sel_dq": [{}],
    "cmp_bwd": [{}, {"cmp_bwd_split": 2}, {"cmp_bwd_split": 4}, {"cmp_bwd_split": 8}],
    "cmp_scores": [{}, {"score_warps": 2}],
}


def _split_variant(base, var):
    """A sweep variant's fields -> (BlockSizes, KernelChoices): each field goes to its owner."""
    cf = {f.name for f in dataclasses.fields(KernelChoices)}
    return (dataclasses.replace(base, **{k: v for k, v in var.items() if k not in cf}),
            KernelChoices(**{k: v for k, v in var.items() if k in cf}))


def sweep(shape, T, reps, log, groups=None):
    """Time each kernel group under BlockSizes / KernelChoices variants at one (shape, T)."""
    Hq, G, D, base, scale, sets = setup(shape, T)
    cf = [cmp_forward(a[0], a[1], a[2], CFG, base, scale, INTERP) for a in sets]
    idxs = [topn_pallas(cmp_block_scores(a[0], a[1], lse, CFG, base, scale, INTERP), CFG, INTERP)
            for a, (_, lse) in zip(sets, cf)]
    fw = [sel_forward(a[0], a[3], a[4], i, CFG, base, scale, INTERP) for a, i in zip(sets, idxs)]
    out = []
    for group, variants in SWEEP.items():
        if groups and group not in groups:
            continue
        for var in variants:
            bs, ch = _split_variant(base, var)
            # the selection pair the op would run with these choices (default at h = 16, T
            # past sel_tiled_max_t: the per-query forward and sel_backward)
            s_fwd, s_bwd = selection_kernels(ch, T, Hq // G, sets[0][0].dtype)
            if group == "sel_fwd":
                fn = jax.jit(lambda q, k, v, i, bs=bs, ch=ch, f=s_fwd: f(
                    q, k, v, i, CFG, bs, scale, INTERP, choices=ch))
                argsets = [(a[0], a[3], a[4], i) for a, i in zip(sets, idxs)]
            elif group == "sel_bwd":
                fn = jax.jit(lambda q, k, v, i, o, lse, do, gs, bs=bs, ch=ch, f=s_bwd: f(
                    q, k, v, i, o, lse, do, gs, CFG, bs, scale, INTERP, choices=ch))
                argsets = [(a[0], a[3], a[4], i, o, lse, a[8], a[7][..., 1])
                           for a, i, (o, lse) in zip(sets, idxs, fw)]
            elif group == "sel_dq":   # the per-query dQ kernel alone (part of "sel_bwd")
                def dq_alone(q, k, v, i, o, lse, do, gs, bs=bs):
                    lse_f, delta = fold_gate(lse, gs, o, do)
                    return sel_dq(q, k, v, i, do, lse_f, delta, CFG, bs,
                                  dot_precision(q.dtype, INTERP, None), scale, INTERP)
                fn = jax.jit(dq_alone)
                argsets = [(a[0], a[3], a[4], i, o, lse, a[8], a[7][..., 1])
                           for a, i, (o, lse) in zip(sets, idxs, fw)]
            elif group == "cmp_fwd":
                fn = jax.jit(lambda q, kc, vc, bs=bs: cmp_forward(q, kc, vc, CFG, bs, scale,
                                                                  INTERP))
                argsets = [(a[0], a[1], a[2]) for a in sets]
            elif group == "cmp_scores":
                fn = jax.jit(lambda q, kc, lse, bs=bs, ch=ch: cmp_block_scores(
                    q, kc, lse, CFG, bs, scale, INTERP, choices=ch))
                argsets = [(a[0], a[1], lse) for a, (_, lse) in zip(sets, cf)]
            else:
                fn = jax.jit(lambda q, kc, vc, o, lse, do, gs, bs=bs, ch=ch: cmp_backward(
                    q, kc, vc, o, lse, do, gs, None, CFG, bs, scale, INTERP, choices=ch))
                argsets = [(a[0], a[1], a[2], o, lse, a[8], a[7][..., 0])
                           for a, (o, lse) in zip(sets, cf)]
            try:
                ms = round(timed(fn, argsets, reps), 4)
            except Exception as e:
                ms = None
                log(f"  {group} {var}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            log(f"  {group:10s} {str(var):32s} {ms} ms")
            out.append({"group": group, "variant": var, "ms": ms})
    return {"shape": shape, "T": T, "reps": reps, "base": dataclasses.asdict(base), "runs": out}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--smoke", action="store_true", help="compile + check every kernel, small T")
    p.add_argument("--sweep", type=int, metavar="T",
                   help="time BlockSizes variants per kernel group at this T (first --shapes)")
    p.add_argument("--groups", nargs="+", choices=sorted(SWEEP),
                   help="with --sweep: only these kernel groups")
    p.add_argument("--T", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    p.add_argument("--shapes", nargs="+", default=["bench", "125m"], choices=sorted(SHAPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sel-impl", nargs="+", choices=["gather", "tiled", "auto"],
                   help="compare selection implementations (fwd, bwd, NSA fwd+bwd) instead")
    p.add_argument("--sel-tile-q", type=int, nargs="+", default=[64],
                   help="tiled selection: query tile sizes to time (with --sel-impl tiled)")
    p.add_argument("--tiled-vars", nargs="+", default=[""], metavar="F=V,...",
                   help="tiled selection: BlockSizes variants to time, e.g. sel_tile_heads=2,"
                        "num_warps=8 ('' = the defaults)")
    p.add_argument("--tokens", type=int, default=32768,
                   help="with --sel-impl: batch B = tokens // T (at least 1)")
    a = p.parse_args(argv)
    log = lambda s: print(s, flush=True)
    if a.smoke:
        return smoke(log)
    if not a.out:
        p.error("--out is required")
    if jax.default_backend() != "gpu":
        sys.exit("bench/kernels.py: needs a GPU (jax.default_backend() is "
                 f"{jax.default_backend()!r})")
    dev = jax.devices()[0]
    doc = {"device": dev.device_kind, "jax": jax.__version__, "python": platform.python_version(),
           "B": 1, "dtype": "bfloat16", "nsa": dataclasses.asdict(CFG),
           "reps": a.reps, "stat": "median wall ms, block_until_ready", "results": []}
    if os.path.exists(a.out):  # extend an earlier run (e.g. the other head shape)
        with open(a.out) as f:
            old = json.load(f)
        keep = [r for r in old.get("results", [])
                if not (r["shape"] in a.shapes and r["T"] in a.T)] \
            if not (a.sweep or a.sel_impl) else old.get("results", [])
        doc["results"] = keep
        for k in ("sweeps", "sel_impl"):
            if k in old:
                doc[k] = old[k]
    if a.sel_impl:
        key = "sel_impl"
        doc.setdefault(key, [])
        for shape in a.shapes:
            for T in a.T:
                B = max(1, a.tokens // T)
                t0 = time.time()
                new = bench_sel_impls(shape, T, B, a.sel_impl, a.sel_tile_q, a.reps, log,
                                      [fields(filter(None, v.split(",")), BlockSizes)
                                       for v in a.tiled_vars])
                print_sel_table(new)
                log(f"   ({time.time() - t0:.0f} s)")
                names = {r["sel_impl"] for r in new}
                doc[key] = [r for r in doc[key] if not (r["shape"] == shape and r["T"] == T
                                                        and r["sel_impl"] in names)] + new
                doc[key].sort(key=lambda r: (r["shape"], r["T"], r["sel_impl"]))
                with open(a.out, "w") as f:
                    json.dump(doc, f, indent=1)
        print("== all", key, "rows in", a.out)
        print_sel_table(doc[key])
        return
    if a.sweep:
        doc.setdefault("sweeps", [])
        doc["sweeps"] = [w for w in doc.get("sweeps", []) if w["T"] != a.sweep]
        doc["sweeps"].append(sweep(a.shapes[0], a.sweep, a.reps, log, a.groups))
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        return
    for shape in a.shapes:
        for T in a.T:
            log(f"== {shape} T={T}")
            t0 = time.time()
            doc["results"].append(bench_one(shape, T, a.reps, log))
            log(f"   ({time.time() - t0:.0f} s)")
            doc["results"].sort(key=lambda r: (r["shape"], r["T"]))
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
    # short table last
    cols = ["sel_fwd", "sel_bwd_inverted", "sel_bwd_atomic", "cmp_score_topn_fwd", "cmp_bwd",
            "win_fwd_bwd", "nsa_fwd", "nsa_fwd_bwd", "dense_fwd", "dense_fwd_bwd"]
    print("shape  T      " + " ".join(f"{c[:12]:>12s}" for c in cols) + "  x_dense")
    for r in doc["results"]:
        vals = " ".join(f"{r['ms'].get(c) or float('nan'):12.2f}" for c in cols)
        print(f"{r['shape']:6s} {r['T']:6d} {vals}  {r.get('speedup_fwd_bwd_vs_dense', '-')}")


if __name__ == "__main__":
    main()
