"""Host time of one decode-step call: how long ``step_jit`` takes to return (dispatch, not the
step), with the steps' graph and state passed three ways (any backend; on the CPU the real
125M model with small caches).

    PYTHONPATH=. python bench/dispatch.py [--model nsa_125m] [--calls 30] [--smoke]

* ``graphdef``: the bare nnx GraphDef and State, as the decode calls took them before
  ``decode_loop.StaticGraph`` (jit hashes the GraphDef, walking the whole graph, on every call);
* ``static``: the StaticGraph (hashed once) and the nnx State (flattened per Variable per call);
* ``flat``: the StaticGraph carrying the state's structure and the state as a flat list of arrays
  (``decode_loop.flat_state``: what ``Decoder`` runs).

Also the time of one ``hash`` of the bare GraphDef. Median of ``--calls`` calls, each waited for
before the next.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import load_model, random_cache  # noqa: E402

from nsa_jax.decode import flat_state, inference_state, step_jit, step_state  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nsa_125m")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="the 2-layer smoke model")
    a = ap.parse_args(argv)
    _, model = load_model(a.model, a.smoke, [])
    g, st = step_state(model, inference_state(model)[1])
    B = 2
    cache = random_cache(model, B, 256 + 4 * a.calls, pos=100, seed=0)
    tok = jnp.zeros((B,), jnp.int32)
    t0 = time.perf_counter()
    for _ in range(10):
        hash(g.graphdef)
    print(f"{a.model}: hash(GraphDef) {(time.perf_counter() - t0) / 10 * 1e3:.3f} ms")
    for name, args in (("graphdef", (g.graphdef, st)), ("static", (g, st)),
                       ("flat", flat_state(g, st))):
        logits, cache = step_jit(*args, cache, tok)          # compile
        jax.block_until_ready(logits)
        ts = []
        for _ in range(a.calls):
            t0 = time.perf_counter()
            logits, cache = step_jit(*args, cache, tok)
            ts.append(time.perf_counter() - t0)
            jax.block_until_ready(logits)
        print(f"  {name:8s} step_jit returns after {statistics.median(ts) * 1e3:.3f} ms "
              f"({len(jax.tree.leaves(args[1]))} state arrays)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
