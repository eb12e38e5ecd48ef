"""The decode step's dense layers alone: each of a 125M block's four matmuls with its fused norm /
SwiGLU / residual, as the XLA expression the model runs (``xla``) and as the row-skinny Pallas
kernel (``nsa_jax.pallas.skinny``) per tile variant, with device time from jax.profiler (GPU):

    PYTHONPATH=. python bench/skinny.py [--batches 1 8 64] [--variants default bn=32 ...]
        [--out bench/results/skinny_<device>.json]

Matmuls (dim 768, H*D 768, mlp_hidden 2048, bf16 weights of N(0, 0.02)): ``proj`` = RMSNorm +
[wq | wkv | wg] (768 -> 1572, the NSA step projection), ``wo`` = 768 -> 768 + residual,
``w_in`` = RMSNorm + 768 -> 2 x 2048 + SwiGLU, ``w_out`` = 2048 -> 768 + residual. One jitted call
runs a matmul 12 times in a ``lax.fori_loop`` (a different input each time, like a step's 12
layers); recorded per matmul and variant: device busy time per layer and kernels per layer, from
one traced call, and the weight bytes over that time. A variant is ``default`` or
``key=value,...`` over :func:`skinny_matmul`'s ``bn``, ``bk``, ``stages``, ``warps``, and ``t=1``:
the weight stored transposed ([N, K], ``w_nk``), made once outside the timed call.
``--smoke``: tiny shapes on the CPU (interpret mode; not a measurement).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

LAYERS = 12


def parse_variant(v: str) -> dict:
    if v == "default":
        return {}
    return {k: int(x) for k, x in (kv.split("=") for kv in v.split(","))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from nsa_jax.pallas.skinny import skinny_matmul, skinny_reference
    from profile_step import load_trace, summarise

    dim, hd, hidden, proj = (768, 768, 2048, 1572) if not a.smoke else (64, 64, 128, 96)
    dt = jnp.float32 if a.smoke else jnp.bfloat16
    interpret = jax.default_backend() != "gpu"
    k = jax.random.split(jax.random.PRNGKey(0), 8)
    w = lambda i, s: (0.02 * jax.random.normal(k[i], s)).astype(dt)
    scale = (1.0 + 0.1 * jax.random.normal(k[5], (dim,))).astype(dt)
    mats = {"proj": (dim, w(0, (dim, proj)), dict(norm=(scale, 1e-5))),
            "wo": (hd, w(1, (hd, dim)), dict(residual=True)),
            "w_in": (dim, w(2, (dim, 2 * hidden)), dict(norm=(scale, 1e-5), glu=True)),
            "w_out": (hidden, w(3, (hidden, dim)), dict(residual=True))}
    dev = jax.devices()[0]
    result = {"benchmark": "decode-step dense layers: XLA vs pallas.skinny",
              "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
              "layers": LAYERS, "rows": []}
    for B in a.batches:
        for name, (K, W, kw) in mats.items():
            x0 = jax.random.normal(k[6], (B, K)).astype(dt)
            nout = W.shape[1] // 2 if kw.get("glu") else W.shape[1]
            res = jax.random.normal(k[7], (B, nout)).astype(dt) if kw.get("residual") else None
            for var in ["xla"] + a.variants:
                opts = dict(kw, residual=res)

                vk = {} if var == "xla" else parse_variant(var)
                Wt = W.T if vk.pop("t", 0) else None      # the weight stored [N, K]

                def f(x, var=var, opts=opts, vk=vk, Wt=Wt):
                    if var == "xla":
                        return skinny_reference(x, W, **opts)
                    if Wt is not None:
                        return skinny_matmul(x, Wt, interpret=interpret, w_nk=True, **opts, **vk)
                    return skinny_matmul(x, W, interpret=interpret, **opts, **vk)

                @jax.jit
                def run(x0):
                    def body(i, acc):
                        x = x0 * (1.0 + 0.01 * i.astype(x0.dtype))
                        return acc + f(x).astype(jnp.float32)
                    return jax.lax.fori_loop(0, LAYERS, body, jnp.zeros((B, nout), jnp.float32))

                try:
                    jax.block_until_ready(run(x0))
                except Exception as e:  # a variant the compiler rejects: recorded, not fatal
                    print(f"B={B:3d} {name:6s} {var:24s} failed: {type(e).__name__}: {e}"[:300])
                    result["rows"].append({"B": B, "matmul": name, "variant": var,
                                           "error": f"{type(e).__name__}: {e}"[:500]})
                    continue
                rec = {"B": B, "matmul": name, "variant": var,
                       "weight_bytes": int(W.size) * W.dtype.itemsize}
                if not a.smoke:
                    jax.block_until_ready(run(x0))
                    with tempfile.TemporaryDirectory() as d:
                        with jax.profiler.trace(d, create_perfetto_trace=True):
                            jax.block_until_ready(run(x0))
                        prof = summarise(load_trace(d), 1, top=12)
                    us = prof["device_busy_ms_per_step"] / LAYERS * 1e3
                    # the fori_loop's own add into acc is one more small kernel per layer in
                    # both modes; counted in both
                    rec.update(busy_us_per_layer=us,
                               kernels_per_layer=prof["n_kernels_per_step"] / LAYERS,
                               weight_tb_s=rec["weight_bytes"] / (us * 1e-6) / 1e12,
                               kernels={x["name"]: x["ms_per_step"] / LAYERS * 1e3
                                        for x in prof["top_kernels"]})
                    print(f"B={B:3d} {name:6s} {var:24s} busy {us:6.2f} us/layer  kernels "
                          f"{rec['kernels_per_layer']:4.1f}  weights {rec['weight_tb_s']:5.2f} "
                          f"TB/s", flush=True)
                else:
                    print(f"B={B:3d} {name:6s} {var:24s} ran (smoke)")
                result["rows"].append(rec)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
