"""Where a blocking call's wall time goes beyond its device span: the NSA op (fwd+bwd, the
grads of ``bench/peers.py``'s ``nsa_fwd_bwd``) and the cuDNN dense yardstick, each timed four
ways in one process:

* ``block_alt``: median wall ms of calls each ended by ``block_until_ready``, alternating two
  input sets (``bench/peers.py``'s rule);
* ``block_same``: the same, one input set every call (buffer addresses repeat);
* ``pipelined``: ``--reps`` calls queued back to back, one ``block_until_ready`` at the end,
  wall / reps (what a training loop that does not wait on each step sees);
* from a ``jax.profiler`` trace of ``block_alt`` calls: device busy and span per call (first
  kernel's start to last kernel's end), and the host-side events that take longest per call.

    PYTHONPATH=. python bench/op_latency.py [--shape bench] [--T 65536] [--reps 10] [--out F]
        [--impl pallas|reference]

Set ``XLA_FLAGS`` in the environment of one process to compare XLA settings (e.g. command
buffers off: ``--xla_gpu_enable_command_buffer=``); the JSON records the flags it ran under.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness import CFG, SHAPES, make_inputs  # noqa: E402
from profile_step import load_trace, summarise  # noqa: E402


def host_top(trace: dict, calls: int, top: int = 12) -> list[dict]:
    """The host-side (non-GPU process) events with the largest total duration, ms per call."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    pname = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    host = {p for p, n in pname.items() if "gpu" not in n.lower()}
    tot, cnt = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in host and "dur" in e:
            tot[e["name"]] += e["dur"]
            cnt[e["name"]] += 1
    return [{"name": n[:120], "ms_per_call": us / 1e3 / calls, "count_per_call": cnt[n] / calls}
            for n, us in tot.most_common(top)]


def timings(fn, argsets, reps: int) -> dict:
    jax.block_until_ready(fn(*argsets[0]))          # compile
    for i in range(3):
        jax.block_until_ready(fn(*argsets[i % len(argsets)]))

    def blocking(sets):
        ts = []
        for i in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*sets[i % len(sets)]))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    r = {"block_alt_ms": blocking(argsets), "block_same_ms": blocking(argsets[:1])}
    t0 = time.perf_counter()
    outs = [fn(*argsets[i % len(argsets)]) for i in range(reps)]
    jax.block_until_ready(outs)
    r["pipelined_ms"] = (time.perf_counter() - t0) / reps * 1e3
    del outs
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for i in range(reps):
                jax.block_until_ready(fn(*argsets[i % len(argsets)]))
        trace = load_trace(tmp)
    s = summarise(trace, reps, 8)
    r.update(busy_ms=s["device_busy_ms_per_step"], span_ms=s["device_span_ms_per_step"],
             top_kernels=s["top_kernels"][:5], host_top=host_top(trace, reps))
    return r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="bench", choices=sorted(SHAPES))
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--impl", default="pallas", choices=("pallas", "reference"))
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.reps < 2:
        p.error(f"--reps: at least 2, got {a.reps}")
    from nsa_jax.nsa import nsa_attention
    Hq, G, D = SHAPES[a.shape]
    sets = [make_inputs(s, a.T, Hq, G, D) for s in (0, 1)]

    def nsa_loss(*x):
        o = nsa_attention(*x[:8], CFG, impl=a.impl)
        return jnp.sum(o.astype(jnp.float32) * x[8].astype(jnp.float32))

    def dense_loss(q, k, v, c):
        impl = "cudnn" if jax.default_backend() == "gpu" else None
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        return jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))

    res = {"shape": a.shape, "T": a.T, "reps": a.reps, "impl": a.impl,
           "device": jax.devices()[0].device_kind, "jax": jax.__version__,
           "xla_flags": os.environ.get("XLA_FLAGS", "")}
    for name, fn, argsets in (
            ("nsa_fwd_bwd", jax.jit(jax.grad(nsa_loss, argnums=tuple(range(8)))), sets),
            ("dense_fwd_bwd", jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2))),
             [(x[0], x[3], x[4], x[8]) for x in sets])):
        r = res[name] = timings(fn, argsets, a.reps)
        print(f"{name:14s} block_alt {r['block_alt_ms']:9.3f}  block_same {r['block_same_ms']:9.3f}"
              f"  pipelined {r['pipelined_ms']:9.3f}  span {r['span_ms']:9.3f}  busy "
              f"{r['busy_ms']:9.3f} ms per call", flush=True)
        for h in r["host_top"][:6]:
            print(f"    host {h['ms_per_call']:8.3f} ms x{h['count_per_call']:<6.1f} "
                  f"{h['name'][:80]}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
