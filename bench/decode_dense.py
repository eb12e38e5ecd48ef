"""The dense model's decode attention alone: XLA (``nsa.decoding.dense_decode_attention``) against
the Pallas flash-decoding kernel (``pallas.decode_dense``), device time from jax.profiler (GPU):

    PYTHONPATH=. python bench/decode_dense.py [--points 65536:8 65536:1 131072:64]
        [--out bench/results/decode_dense_<device>.json]

125M attention shape (Hq=12, G=2, D=64), bf16 caches of N + 256 slots, every row at position N-1.
One jitted call runs the attention 12 times in a ``lax.fori_loop`` (a different query each time,
like a step's 12 layers); recorded per implementation: device busy time per layer and kernels per
layer from one traced call, and the K/V bytes read (N keys per row and group) over that time.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="+", default=["65536:8", "65536:1", "131072:64"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from nsa_jax.nsa.decoding import dense_decode_attention
    from nsa_jax.pallas.decode_dense import dense_decode_pallas
    from profile_step import load_trace, summarise

    Hq, G, D = 12, 2, 64
    dt = jnp.bfloat16
    if a.smoke:
        a.points, dt = ["300:2"], jnp.float32
    impls = {"xla": dense_decode_attention, "pallas": dense_decode_pallas}
    dev = jax.devices()[0]
    result = {"benchmark": "dense decode attention: XLA vs pallas.decode_dense",
              "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
              "layers": LAYERS, "shape": {"Hq": Hq, "G": G, "D": D}, "rows": []}
    for pt in a.points:
        N, B = map(int, pt.split(":"))
        S = N + 256
        ks = jax.random.split(jax.random.PRNGKey(N + B), 3)
        k = jax.random.normal(ks[0], (B, G, S, D), dt)
        v = jax.random.normal(ks[1], (B, G, S, D), dt)
        q0 = jax.random.normal(ks[2], (B, Hq, D), dt)
        t = jnp.full((B,), N - 1, jnp.int32)
        kv_bytes = 2 * B * G * N * D * jnp.dtype(dt).itemsize
        for name, fn in impls.items():
            @jax.jit
            def run(q0, k, v, t, fn=fn):
                def body(i, acc):
                    q = q0 * (1.0 + 0.01 * i.astype(q0.dtype))
                    return acc + fn(q, k, v, t).astype(jnp.float32)
                return jax.lax.fori_loop(0, LAYERS, body, jnp.zeros(q0.shape, jnp.float32))

            out = jax.block_until_ready(run(q0, k, v, t))
            rec = {"N": N, "B": B, "impl": name, "kv_bytes_per_layer": kv_bytes,
                   "checksum": float(jnp.sum(out))}
            if not a.smoke:
                jax.block_until_ready(run(q0, k, v, t))
                with tempfile.TemporaryDirectory() as d:
                    with jax.profiler.trace(d, create_perfetto_trace=True):
                        jax.block_until_ready(run(q0, k, v, t))
                    prof = summarise(load_trace(d), 1, top=12)
                us = prof["device_busy_ms_per_step"] / LAYERS * 1e3
                rec.update(busy_us_per_layer=us, kernels_per_layer=prof["n_kernels_per_step"] / LAYERS,
                           kv_tb_s=kv_bytes / (us * 1e-6) / 1e12,
                           kernels={x["name"]: x["ms_per_step"] / LAYERS * 1e3
                                    for x in prof["top_kernels"]})
                print(f"N={N:6d} B={B:3d} {name:6s} busy {us:7.2f} us/layer  kernels "
                      f"{rec['kernels_per_layer']:4.1f}  K/V {rec['kv_tb_s']:5.2f} TB/s", flush=True)
            else:
                print(f"N={N} B={B} {name}: ran (smoke), checksum {rec['checksum']:.4f}")
            result["rows"].append(rec)
        del k, v
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
