"""The decode step's dense parts for a whole model, XLA against ``pallas.decode_dense``.

    PYTHONPATH=. python bench/decode_dense.py [--batches 8 64] [--variants 16:256 32:256]

One jitted chain over ``--layers`` layers, each with its own weights (the 125M model's: dim 768,
the NSA step projection's 1572 columns, SwiGLU hidden 2048; bf16), so the weights stream from
HBM as in a decode step (12 layers hold 156 MB, more than the L2): per layer
``P = RMSNorm(x) @ W_step``, ``r = x + P[:, :768] @ W_o``, ``x = r + swiglu(RMSNorm(r) @ W_in)
@ W_out``. ``xla`` writes it in jax.numpy (what the model ran before); ``pallas BN:BK`` runs the
four kernels with BN output columns per program and BK reduction elements per loop step. Median
of ``--reps`` calls, ms per chain (one token of the dense parts), and each chain's relative RMSE
against the same chain in float32 (HIGHEST precision); JSON with ``--out``. The floor
is the weights' bytes over the HBM bandwidth given by ``--hbm-tbs``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nsa_jax.pallas import decode_dense as dd  # noqa: E402
from nsa_jax.swiglu import swiglu  # noqa: E402

DIM, NP, HID, EPS = 768, 1572, 2048, 1e-6


def weights(layers: int, key, dtype=jnp.bfloat16):
    ks = jax.random.split(key, 6)
    n = lambda k, s, f: (jax.random.normal(k, (layers,) + s) / f).astype(dtype)
    return dict(s1=1.0 + n(ks[0], (DIM,), 10.0), w_step=n(ks[1], (DIM, NP), DIM ** 0.5),
                wo=n(ks[2], (DIM, DIM), DIM ** 0.5), s2=1.0 + n(ks[3], (DIM,), 10.0),
                w_in=n(ks[4], (DIM, 2 * HID), DIM ** 0.5), w_out=n(ks[5], (HID, DIM), HID ** 0.5))


def _rms(x, s):
    xf = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + EPS)
    return (xf * (inv * s.astype(jnp.float32))).astype(x.dtype)


def chain_xla(x, W):
    for i in range(W["wo"].shape[0]):
        P = _rms(x, W["s1"][i]) @ W["w_step"][i]
        r = x + P[:, :DIM] @ W["wo"][i]
        x = r + swiglu(_rms(r, W["s2"][i]) @ W["w_in"][i]) @ W["w_out"][i]
    return x


def chain_pallas(x, W, bn, bk):
    for i in range(W["wo"].shape[0]):
        P = dd.norm_matmul(x, W["s1"][i], W["w_step"][i], eps=EPS, bn=bn, bk=bk)
        r = dd.matmul_add(P[:, :DIM], W["wo"][i], x, bn=bn, bk=bk)
        u = dd.norm_matmul(r, W["s2"][i], W["w_in"][i], eps=EPS, glu=True, bn=bn, bk=bk)
        x = dd.matmul_add(u, W["w_out"][i], r, bn=bn, bk=bk)
    return x


def timed(f, *args, reps: int) -> float:
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--variants", nargs="+", default=["16:256", "32:256", "16:128"])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM TB/s for the floor")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    W = weights(a.layers, jax.random.PRNGKey(0))
    wbytes = sum(int(v.size) * v.dtype.itemsize for v in W.values())
    rows = []
    for B in a.batches:
        x = jax.random.normal(jax.random.PRNGKey(1), (B, DIM)).astype(jnp.bfloat16)
        W32 = jax.tree.map(lambda v: v.astype(jnp.float32), W)
        with jax.default_matmul_precision("highest"):
            ref = jax.jit(chain_xla)(x.astype(jnp.float32), W32)
        rr = lambda got: float(jnp.sqrt(jnp.mean((got.astype(jnp.float32) - ref) ** 2))
                               / jnp.sqrt(jnp.mean(ref ** 2)))
        res = {"batch": B, "xla_ms": timed(jax.jit(chain_xla), x, W, reps=a.reps),
               "xla_rrmse_vs_f32": rr(jax.jit(chain_xla)(x, W)),
               "floor_ms": wbytes / (a.hbm_tbs * 1e12) * 1e3}
        for v in a.variants:
            bn, bk = (int(s) for s in v.split(":"))
            f = jax.jit(lambda x, W, bn=bn, bk=bk: chain_pallas(x, W, bn, bk))
            try:
                res[f"pallas_{v}_ms"] = timed(f, x, W, reps=a.reps)
                res[f"pallas_{v}_rrmse_vs_f32"] = rr(f(x, W))
            except Exception as e:       # a tile that does not compile (shared memory)
                res[f"pallas_{v}_error"] = str(e).splitlines()[0][:160]
        rows.append(res)
        cell = lambda v: (f"pallas {v} {res[f'pallas_{v}_ms']:.3f} ms (rrmse "
                          f"{res[f'pallas_{v}_rrmse_vs_f32']:.1e})" if f"pallas_{v}_ms" in res
                          else f"pallas {v} failed: {res[f'pallas_{v}_error']}")
        print(f"B={B:3d}  xla {res['xla_ms']:.3f} ms (rrmse {res['xla_rrmse_vs_f32']:.1e})  "
              + "  ".join(cell(v) for v in a.variants) + f"  floor {res['floor_ms']:.3f} ms",
              flush=True)
    if a.out:
        meta = {"benchmark": "decode dense parts, 12-layer chain", "device":
                jax.devices()[0].device_kind, "jax": jax.__version__, "layers": a.layers,
                "weight_bytes": wbytes, "reps": a.reps, "rows": rows}
        Path(a.out).write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
