"""Causal flash attention three ways on one GPU: cuDNN, Pallas on Triton, Pallas on Mosaic GPU.

    python bench/mgpu_probe.py [--shapes 125m:16:2048 bench:1:16384] [--reps 20] [--out F.json]

Why: jax 0.11.0 deprecated the Pallas Triton backend that all of nsa_jax's kernels are written for
("will be removed in a future version of JAX"; README, "Supported versions"). The way forward it
names is Pallas Mosaic GPU (Hopper and newer). Before porting any kernel, this measures what the two
Pallas backends reach on the same algorithm, against cuDNN, on the GPU at hand: dense causal
attention (every NSA branch is a masked flash attention), forward and forward + backward, at the
125M and bench head shapes (GQA):

* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``;
* ``ours_triton``: nsa_jax's document-local kernel (``pallas/local.py``: FlashAttention-2 on the
  Triton backend, the kernel the window and packed branches use) with one document per row, no
  window; float32 output, as it returns;
* ``jax_triton``: jax's own Pallas Triton attention (``pallas.ops.gpu.attention.mha``; K/V heads
  repeated to Hq, which it needs);
* ``jax_mgpu`` / ``jax_mgpu_kv128``: jax's own Pallas Mosaic GPU attention
  (``pallas.ops.gpu.attention_mgpu``: warpgroup MMA, TMA, two compute warpgroups of 64 query
  rows) with 64- / 128-key tiles, in float16 (its shared-memory buffers are float16 in jax 0.11.2;
  bf16 inputs fail there). Its causal backward may be missing in a jax version: then that row
  says so.

Each variant's output is checked against cuDNN's (relative RMSE). Timings are wall-clock medians
of ``--reps`` calls (``harness.timed``); TFLOP/s counts causal work (half the square). Benchmark
only, GPU only; no kernel of nsa_jax depends on it.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import SHAPES, timed  # noqa: E402


def _rrmse(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.sqrt(jnp.mean((a - b) ** 2) / jnp.mean(b ** 2)))


def _variants(D, G, Hq):
    """name -> f(q, k, v) -> o [B,T,Hq,D], causal."""
    from nsa_jax.pallas.local import local_attention
    out = {"cudnn": lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn"),
        "ours_triton": lambda q, k, v: local_attention(q, k, v)}
    try:
        from jax.experimental.pallas.ops.gpu import attention as tri
        rep = Hq // G
        out["jax_triton"] = lambda q, k, v: tri.mha(
            q, jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2), None,
            sm_scale=1.0 / math.sqrt(D), causal=True)
    except ImportError as e:
        print(f"jax_triton unavailable: {e}")
    try:
        from jax.experimental.pallas.ops.gpu import attention_mgpu as mg
        for tag, bkv in (("", 64), ("_kv128", 128)):
            cfg = mg.TuningConfig(block_q=64, block_kv=bkv, max_concurrent_steps=2, causal=True,
                                  block_q_dkv=64, block_kv_dkv=bkv, block_q_dq=64,
                                  block_kv_dq=bkv)
            # the kernel applies no softmax scale (q is scaled as cuDNN's default does), and its
            # shared-memory buffers are float16 (jax 0.11.2: bf16 inputs fail), so it runs float16
            h16 = lambda x: x.astype(jnp.float16)
            out["jax_mgpu" + tag] = functools.partial(
                lambda q, k, v, cfg: mg.attention(h16(q * (1.0 / math.sqrt(D))), h16(k), h16(v),
                                                  cfg), cfg=cfg)
    except ImportError as e:
        print(f"jax_mgpu unavailable: {e}")
    return out


def run_shape(name, B, T, reps):
    Hq, G, D = SHAPES[name]
    ks = jax.random.split(jax.random.PRNGKey(T + B), 4)
    mk = lambda k, h: jax.random.normal(k, (B, T, h, D), jnp.float32).astype(jnp.bfloat16)
    q, k, v, do = mk(ks[0], Hq), mk(ks[1], G), mk(ks[2], G), mk(ks[3], Hq)
    flops_fwd = 4.0 * B * Hq * D * T * T / 2            # QK^T and PV over the causal half
    rows, ref = [], None
    for vname, f in _variants(D, G, Hq).items():
        rec = {"shape": name, "B": B, "T": T, "variant": vname}
        try:
            fwd = jax.jit(f)
            o = fwd(q, k, v)
            if ref is None:
                ref = o
            rec["rrmse_vs_cudnn"] = _rrmse(o, ref)
            rec["fwd_ms"] = timed(fwd, [(q, k, v)], reps)
            rec["fwd_tflops"] = flops_fwd / rec["fwd_ms"] / 1e9
        except Exception as e:  # noqa: BLE001 -- a benchmark row says why it has no number
            rec["fwd_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            traceback.print_exc(limit=2)
        try:
            def loss(q, k, v, f=f):
                return jnp.sum(f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
            fb = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            jax.block_until_ready(fb(q, k, v))
            rec["fwd_bwd_ms"] = timed(fb, [(q, k, v)], reps)
            rec["fwd_bwd_tflops"] = 3.5 * flops_fwd / rec["fwd_bwd_ms"] / 1e9
        except Exception as e:  # noqa: BLE001
            rec["fwd_bwd_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(rec)
        msg = " ".join(f"{key} {rec[key]:.3f}" if isinstance(rec[key], float) else
                       f"{key} {rec[key]}" for key in rec if key not in ("shape", "B", "T", "variant"))
        print(f"{name:5s} B={B:2d} T={T:6d} {vname:12s} {msg}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["125m:16:2048", "125m:4:8192", "bench:1:16384"],
                    help="SHAPE:B:T (SHAPE in bench.harness.SHAPES)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if jax.default_backend() != "gpu":
        print("mgpu_probe: needs a CUDA GPU (it times compiled kernels)")
        return 2
    dev = jax.devices()[0]
    print(f"{dev.device_kind}, jax {jax.__version__}", flush=True)
    rows = []
    for spec in a.shapes:
        name, B, T = spec.split(":")
        rows += run_shape(name, int(B), int(T), a.reps)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": dev.device_kind, "jax": jax.__version__,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
