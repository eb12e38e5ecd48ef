"""The decode step's dense layers alone: ``pallas.decode_layers`` per tile variant against XLA's
form (the modules' expressions), with per-kernel device time from jax.profiler (GPU):

    PYTHONPATH=. python bench/decode_layers.py [--batches 8 64 1] [--variants xla default cols=16 ...]
        [--out bench/results/decode_layers_<device>.json]

125M NSA shape (dim 768, step projection 768 x 1572, wo 768 x 768, w_in 768 x 4096, w_out
2048 x 768, bf16). One jitted call runs a block's dense layers for 12 layers, each with its own
weights (156 MB in all, past the 50 MB L2, as in a decode step) and on the previous one's
output: RMSNorm + the step projection, wo + residual, RMSNorm + w_in + SwiGLU, w_out + residual. Recorded per variant: device time per layer
summed over its kernels (one traced call) and its kernels, and the wall time per layer (median
of 10 synced calls). A variant is ``default``, ``xla`` or ``key=value,...`` over the kernels'
tile arguments (``cols``, ``k_step``, ``stages``, ``warps``, ``unroll`` 0 / 1; the same for all
three kernels).
``--smoke``: tiny shapes on the CPU, interpret mode (not a measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

LAYERS = 12


def parse_variant(var: str) -> dict:
    """``default`` / ``xla`` -> {}; ``cols=16,warps=2`` -> {"cols": 16, "warps": 2}."""
    if var in ("default", "xla"):
        return {}
    out = {}
    for part in var.split(","):
        k, _, v = part.partition("=")
        if k not in ("cols", "k_step", "stages", "warps", "unroll") or not v.isdigit():
            raise SystemExit(f"--variants: {var!r}: want key=int,... over cols, k_step, stages, "
                             f"warps, unroll (0 or 1)")
        out[k] = bool(int(v)) if k == "unroll" else int(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--variants", nargs="+", default=["xla", "default"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (not a measurement)")
    a = ap.parse_args(argv)
    variants = {v: parse_variant(v) for v in a.variants}
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from nsa_jax.pallas.decode_layers import linear_add, norm_linear, norm_swiglu
    from nsa_jax.swiglu import swiglu
    from profile_step import load_trace, summarise

    dim, n_step, hidden = (32, 72, 48) if a.smoke else (768, 1572, 2048)
    bf = jnp.bfloat16
    ks = iter(jax.random.split(jax.random.PRNGKey(0), 8 * LAYERS))
    w = lambda *s: (jax.random.normal(next(ks), s) / s[0] ** 0.5).astype(bf)   # noqa: E731
    Ws = [dict(step=w(dim, n_step), wo=w(dim, dim), w_in=w(dim, 2 * hidden),
               w_out=w(hidden, dim), s1=jnp.ones((dim,), bf), s2=jnp.ones((dim,), bf))
          for _ in range(LAYERS)]
    eps = 1e-5
    norm = nnx.RMSNorm(dim, epsilon=eps, dtype=bf, param_dtype=bf, rngs=nnx.Rngs(0))

    def xla_layer(x, W, _kw):
        P = jnp.dot(norm(x), W["step"])
        x = x + jnp.dot(P[:, :dim], W["wo"])              # P's first columns stand in for o
        return x + jnp.dot(swiglu(jnp.dot(norm(x), W["w_in"])), W["w_out"])

    def pallas_layer(x, W, kw):
        P = norm_linear(x, W["s1"], eps, W["step"], **kw)
        x = linear_add(P[:, :dim], W["wo"], x, **kw)
        return linear_add(norm_swiglu(x, W["s2"], eps, W["w_in"], **kw), W["w_out"], x, **kw)

    rows = []
    for B in a.batches:
        x0 = jax.random.normal(next(ks), (B, dim)).astype(bf)
        for var, kw in variants.items():
            f = xla_layer if var == "xla" else pallas_layer
            def layers(x, Ws, f=f, kw=kw):
                for W in Ws:
                    x = f(x, W, kw) * jnp.asarray(0.5, bf)
                return x
            run = jax.jit(layers)
            try:
                x = jax.block_until_ready(run(x0, Ws))
            except Exception as e:                  # e.g. a tile that needs more shared memory
                msg = str(e).splitlines()[0][:160]
                rows.append({"batch": B, "variant": var, "error": msg})
                print(f"B={B:3d} {var:32s} failed: {msg}", flush=True)
                continue
            ts = []
            for _ in range(2 if a.smoke else 10):
                t0 = time.perf_counter()
                x = jax.block_until_ready(run(x, Ws))
                ts.append(time.perf_counter() - t0)
            r = {"batch": B, "variant": var, "wall_us": 1e6 * statistics.median(ts) / LAYERS}
            if not a.smoke:
                with tempfile.TemporaryDirectory() as td:
                    with jax.profiler.trace(td, create_perfetto_trace=True):
                        jax.block_until_ready(run(x, Ws))
                    prof = summarise(load_trace(td), steps=LAYERS, top=12)
                r["busy_us"] = 1e3 * prof["device_busy_ms_per_step"]
                r["kernels"] = {o["name"]: round(1e3 * o["ms_per_step"], 2)
                                for o in prof["top_ops"]}
            rows.append(r)
            busy = f"busy {r['busy_us']:6.2f} us  " if "busy_us" in r else ""
            print(f"B={B:3d} {var:32s} {busy}wall {r['wall_us']:6.2f} us per layer  "
                  + " ".join(f"{k} {v}" for k, v in list(r.get("kernels", {}).items())[:6]),
                  flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                           "jax": jax.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
