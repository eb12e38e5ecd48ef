"""The decode step's compressed-block emission alone (φ_K + RoPE, φ_V, the compressed-cache write)
per tile variant of ``pallas.phi_decode`` against XLA's form (``compress_block`` + the write), with
per-kernel device time from jax.profiler (GPU):

    PYTHONPATH=. python bench/phi_decode.py [--batches 64 8] [--variants default rows=16,k_tile=256 ...]
        [--out bench/results/phi_decode_<device>.json]

125M shape (G=2, D=64, l=32, φ hidden 256, bf16). One jitted call runs the emission 12 times (a
step's layers) in a ``lax.fori_loop``; recorded per variant: device time per emission summed over
its kernels (one traced call), and the wall time per emission (median of 10 synced calls).
A variant is ``default``, ``xla`` or ``key=value,...`` over :func:`emit_pallas`'s tile arguments.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 8])
    ap.add_argument("--variants", nargs="+", default=["xla", "default"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from nsa_jax.nsa.decoding import write_rows
    from nsa_jax.nsa.compression import compress_block
    from nsa_jax.nsa.rope import apply_rope, cos_sin
    from nsa_jax.pallas.phi_decode import emit_pallas
    from profile_step import load_trace, summarise

    G, l, D, H, Tc, L = 2, 32, 64, 256, 8193, 12
    bf = jnp.bfloat16
    ks = iter(jax.random.split(jax.random.PRNGKey(0), 32))
    nrm = lambda *s: jax.random.normal(next(ks), s)
    phi = [(0.02 * nrm(l, D), (0.02 * nrm(l * D, H)).astype(bf), jnp.zeros((H,), bf),
            (0.06 * nrm(H, D)).astype(bf), jnp.zeros((D,), bf)) for _ in range(2)]
    rows = []
    for B in a.batches:
        kb, vb = nrm(B, G, l, D).astype(bf), nrm(B, G, l, D).astype(bf)
        kc, vc = jnp.zeros((B, G, Tc, D), bf), jnp.zeros((B, G, Tc, D), bf)
        off = 16 * jnp.arange(B, dtype=jnp.int32)
        idx = off // 16
        cos, sin = cos_sin(off + l - 1, D)

        # the blocks depend on the loop index, so XLA cannot hoist φ out of the loop (it did:
        # the first sweep's XLA row timed only the writes)
        vary = lambda x, i: x + i.astype(x.dtype)

        def xla_emit(kc, vc, _kw, i):
            k = apply_rope(compress_block(vary(kb, i), *phi[0]), (off + l - 1)[:, None])
            v = compress_block(vary(vb, i), *phi[1])
            return write_rows(kc, k[:, 0], idx), write_rows(vc, v[:, 0], idx)

        def pallas_emit(kc, vc, kw, i):
            return emit_pallas(kc, vc, vary(kb, i), vary(vb, i), idx, cos, sin, phi[0], phi[1],
                               interpret=False, **kw)

        for var in a.variants:
            kw = {} if var in ("default", "xla") else {
                k: int(v) for k, v in (p.split("=") for p in var.split(","))}
            f = xla_emit if var == "xla" else pallas_emit
            run = jax.jit(lambda kc, vc, f=f, kw=kw: jax.lax.fori_loop(
                0, L, lambda i, c: f(*c, kw, i), (kc, vc)), donate_argnums=(0, 1))
            c = run(kc, vc)
            jax.block_until_ready(c)
            ts = []
            for _ in range(10):
                t0 = time.perf_counter()
                c = run(*c)
                jax.block_until_ready(c)
                ts.append(time.perf_counter() - t0)
            with tempfile.TemporaryDirectory() as td:
                with jax.profiler.trace(td, create_perfetto_trace=True):
                    c = run(*c)
                    jax.block_until_ready(c)
                prof = summarise(load_trace(td), steps=L, top=8)
            kc, vc = c
            r = {"batch": B, "variant": var, "wall_us": 1e6 * statistics.median(ts) / L,
                 "busy_us": 1e3 * prof["device_busy_ms_per_step"],
                 "kernels": {o["name"]: round(1e3 * o["ms_per_step"], 2) for o in prof["top_ops"]}}
            rows.append(r)
            print(f"B={B:3d} {var:34s} busy {r['busy_us']:6.1f} us  wall {r['wall_us']:6.1f} us  "
                  + " ".join(f"{k} {v}" for k, v in list(r["kernels"].items())[:4]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": jax.devices()[0].device_kind, "rows": rows},
                                          indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
