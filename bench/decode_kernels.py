"""The Pallas decode kernels alone (one layer's NSA attention of one token per row), per tile
variant, with per-kernel device time from jax.profiler (GPU):

    PYTHONPATH=. python bench/decode_kernels.py [--points 65536:1 65536:8 131072:64]
        [--variants default sel_chunk=128 merge_tile=32 splits=8 ...] [--tree DIR]
        [--distinct 12] [--out bench/results/decode_kernels_<device>.json]

125M attention shape (G=2, h=6, D=64, bf16 caches of N(0,1) values, paper NSA defaults), every
row at position N-1. One jitted call runs the attention ``--layers`` (12) times (a different query
each time, like a step's 12 layers) over ``--distinct`` sets of caches, layer i on set i mod
distinct (default: one set per layer, as a step reads them). ``--distinct 1`` is the harness of
the sessions before the twenty-ninth: one set in a ``lax.fori_loop``, which at small B x context
(the compressed caches of 64k / B=8 are 17 MB) the L2 serves after the first layer, so its kernels
look faster than in a step (H100, 64k / B=8, compressed kernel: 5.7 us per layer there against 9.7
in the decode loop; bench/NOTES.md, twenty-ninth session). Recorded: the wall time per layer of
that call (median of 10 synced calls) and, from one traced call, the device time per kernel and
per layer. A variant is ``default`` or ``key=value,...`` over
:func:`nsa_jax.pallas.decode.nsa_decode_pallas`'s tile arguments (``cmp_keys``, ``win_keys``,
``splits``, ``sel_chunk``, ``merge_tile``, ``sel_rank``, ``score_warps``, ...; integers or names). ``--tree DIR`` imports ``nsa_jax`` from another
checkout (e.g. the tree before a change, for a same-call comparison; arguments it lacks are
dropped with a note). ``--smoke``: tiny shapes on the CPU (interpret mode; not a measurement).
``--warm-only``: compile and run each variant twice, nothing timed or traced (for Nsight Compute:
with one point, one variant and ``--layers`` L, launches L+1..2L of a kernel are warm).
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_variant(v: str) -> dict:
    if v == "default":
        return {}
    out = {}
    for kv in v.split(","):
        k, val = kv.split("=")
        out[k] = int(val) if val.lstrip("-").isdigit() else val
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="+", default=["65536:1", "65536:8", "131072:64"])
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--distinct", type=int, default=None,
                    help="cache sets, layer i on set i mod distinct (default: --layers)")
    ap.add_argument("--tree", default=None, help="import nsa_jax from this checkout")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--warm-only", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(a.tree).resolve() if a.tree else HERE.parent))
    sys.path.insert(0, str(HERE))
    import jax
    import jax.numpy as jnp

    from nsa_jax.nsa import NSAConfig
    from nsa_jax.pallas import decode as pdec
    from profile_step import load_trace, summarise   # after nsa_jax: it puts this repo on the path

    cfg = NSAConfig()
    G, h, D = 2, 6, 64
    if a.smoke:
        a.points = ["512:2"]
        cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=32)
    accepted = set(inspect.signature(pdec.nsa_decode_pallas).parameters)
    bf = jnp.float32 if a.smoke else jnp.bfloat16
    dev = jax.devices()[0]
    result = {"benchmark": "Pallas decode kernels, one layer's NSA attention",
              "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
              "tree": a.tree or ".", "nsa_jax": str(Path(pdec.__file__).parent.parent),
              "layers": a.layers, "shape": {"G": G, "h": h, "D": D},
              "nsa": cfg.__dict__ if hasattr(cfg, "__dict__") else str(cfg), "points": []}
    for pt in a.points:
        N, B = map(int, pt.split(":"))
        S = -(-N // 256) * 256
        Tc = cfg.num_cmp_blocks(S) + 1
        shapes = {"k_cmp": Tc, "v_cmp": Tc, "k_slc": S, "v_slc": S, "k_win": cfg.window,
                  "v_win": cfg.window}
        L = max(1, min(a.distinct or a.layers, a.layers))

        def cache_set(seed):
            ks = jax.random.split(jax.random.PRNGKey(seed), 6)
            return {k: jax.random.normal(ks[i], (B, G, n, D), bf) for i, (k, n) in
                    enumerate(shapes.items())}
        kvs = [cache_set(N + B + 1000 * i) for i in range(L)]
        ks = jax.random.split(jax.random.PRNGKey(N + B), 8)
        gates = jax.nn.sigmoid(jax.random.normal(ks[6], (B, G * h, 3))).astype(bf)
        q0 = jax.random.normal(ks[7], (B, G * h, D), bf)
        t = jnp.full((B,), N - 1, jnp.int32)
        for var in a.variants:
            kw = parse_variant(var)
            dropped = sorted(set(kw) - accepted)
            kw = {k: v for k, v in kw.items() if k in accepted}

            @jax.jit
            def run(q0, kvs, t, gates):
                def layer(i, acc, kv):
                    q = q0 * (1.0 + 0.01 * jnp.asarray(i).astype(q0.dtype))
                    return acc + pdec.nsa_decode_pallas(q, kv, t, gates, cfg, **kw).astype(
                        jnp.float32)
                acc = jnp.zeros(q0.shape, jnp.float32)
                if len(kvs) == 1:      # the earlier harness: one cache set, L2-warm after layer 1
                    return jax.lax.fori_loop(0, a.layers, lambda i, c: layer(i, c, kvs[0]), acc)
                for i in range(a.layers):
                    acc = layer(i, acc, kvs[i % len(kvs)])
                return acc

            jax.block_until_ready(run(q0, kvs, t, gates))
            if a.warm_only:
                jax.block_until_ready(run(q0, kvs, t, gates))
                print(f"N={N} B={B} {var}: ran twice (--warm-only)", flush=True)
                continue
            ts = []
            for _ in range(3 if a.smoke else 10):
                t0 = time.perf_counter()
                jax.block_until_ready(run(q0, kvs, t, gates))
                ts.append(time.perf_counter() - t0)
            rec = {"N": N, "B": B, "variant": var, "dropped": dropped, "distinct": L,
                   "wall_us_per_layer": statistics.median(ts) / a.layers * 1e6}
            if not a.smoke:
                with tempfile.TemporaryDirectory() as d:
                    with jax.profiler.trace(d, create_perfetto_trace=True):
                        jax.block_until_ready(run(q0, kvs, t, gates))
                    prof = summarise(load_trace(d), 1, top=20)
                rec["busy_us_per_layer"] = prof["device_busy_ms_per_step"] / a.layers * 1e3
                rec["kernels_us_per_layer"] = {
                    k["name"]: k["ms_per_step"] / a.layers * 1e3 for k in prof["top_kernels"]
                    if k["name"].startswith("nsa_decode")}
            result["points"].append(rec)
            ker = " ".join(f"{k.replace('nsa_decode_', '')} {v:5.1f}"
                           for k, v in rec.get("kernels_us_per_layer", {}).items())
            print(f"{Path(a.tree or '.').name[:12]:12s} N={N:6d} B={B:2d} {var:28s} wall {rec['wall_us_per_layer']:7.1f} us/layer "
                  f"busy {rec.get('busy_us_per_layer', 0):6.1f}  {ker}"
                  + (f"  (dropped {dropped})" if dropped else ""), flush=True)
        del kvs
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
