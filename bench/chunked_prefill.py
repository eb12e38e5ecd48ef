"""Chunked prefill against one prefill: time, memory and logits (issue 14).

    PYTHONPATH=. python bench/chunked_prefill.py [--models nsa_125m dense_125m]
        [--lengths 32768 65536] [--chunks 8192 16384] [--reps 3] [--out F.json] [--smoke]
        [--no-whole] [--set KEY=VALUE ...]

For each model (configs/<model>.yaml, random parameters, the config's dtype) and prompt length
N (batch 1, a random prompt), a :class:`nsa_jax.decode.Decoder` of N + 64 tokens prefills the
prompt at once and in each chunk length C < N (``Decoder.prefill``'s ``chunk``: the first C tokens
by the parallel forward, the rest C at a time by ``decode_loop.extend_jit``). Recorded per point:

* ``need_mib``: the prefill's device bytes beyond the weights and the cache, from XLA's memory
  analysis of the compiled calls (``Decoder.prefill_bytes``: with a chunk, the larger of the
  first chunk's and a continuation's);
* ``ms``: median wall time of ``--reps`` prefills after one that compiles (each synchronised on
  its logits), ``tok_s`` = N / that;
* ``dispatch_ms``: median time until ``Decoder.prefill`` returned, before waiting on the GPU
  (near ``ms`` when the host, not the GPU, is what the prefill waits on: launches, or
  XLA reading a ``lax.switch``'s index back on the host);
* ``rel_rmse``: the last token's logits against the prefill at once (float32 logits; the two
  paths round differently in bf16); None with ``--no-whole`` (no prefill at once).

``--profile`` traces one chunked prefill per model and length (the largest chunk) with
``jax.profiler`` and records its device time per op (``bench/profile_step.py``'s summariser;
``profile`` in the JSON, the top ops printed; ``profile.host``: the host threads' events,
inclusive ms by thread and name). ``--smoke`` shrinks the models and lengths so the
script runs on the CPU (not a measurement). ``--compile-cache DIR`` puts JAX's persistent
compilation cache there: a second process then reports the compile read back (``compile_s``).
The table prints last; the JSON holds the device, versions and every record.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nsa_jax import compile_cache  # noqa: E402
from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.decode import Decoder  # noqa: E402
from nsa_jax.model import build_model  # noqa: E402

SMOKE_MODEL = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_groups": 2, "head_dim": 16,
               "mlp_hidden": 128, "vocab_size": 512}


def load_model(name: str, smoke: bool, overrides=()):
    sets = [f"model.{k}={v}" for k, v in SMOKE_MODEL.items()] if smoke else []
    sets += list(overrides)
    if smoke:
        sets.append("model.compute_dtype=float32")
    cfg = load_config(REPO / "configs" / f"{name}.yaml", sets)
    return build_model(cfg.model, cfg.nsa, seed=0, exec_cfg=cfg.exec)


def profile(dec, toks, chunk: int) -> dict:
    """One prefill of ``toks`` in chunks of ``chunk`` (compiled already) under the profiler."""
    import tempfile
    sys.path.insert(0, str(REPO / "bench"))
    from profile_step import host_events, load_trace, summarise
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            dec.prefill(toks, chunk=chunk).block_until_ready()
        trace = load_trace(d)
        return dict(summarise(trace, 1, top=25), host=host_events(trace, 1, top=25))


def measure(model, N: int, chunks: list[int], reps: int, trace: bool = False,
            whole: bool = True) -> list[dict]:
    dec = Decoder(model, 1, N + 64)
    toks = jax.random.randint(jax.random.PRNGKey(N), (1, N), 0, model.mcfg.vocab_size)
    out, want = [], None
    for c in [None] * whole + [c for c in chunks if c < N]:
        c0 = dec.compile_s
        need = dec.prefill_bytes(1, N, chunk=c)
        logits = np.asarray(dec.prefill(toks, chunk=c))         # compiles (ahead of time)
        times, sent = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            got = dec.prefill(toks, chunk=c)
            sent.append(time.perf_counter() - t0)
            got.block_until_ready()
            times.append(time.perf_counter() - t0)
        ms = 1e3 * statistics.median(times)
        if want is None and c is None:
            want = logits
        err = None if want is None else float(
            np.sqrt(np.mean((logits - want) ** 2)) / np.sqrt(np.mean(want ** 2)))
        out.append({"N": N, "chunk": c, "need_mib": None if need is None else need / 2**20,
                    "ms": ms, "tok_s": N / ms * 1e3, "rel_rmse": err,
                    "dispatch_ms": 1e3 * statistics.median(sent),
                    "compile_s": dec.compile_s - c0, "times_ms": [1e3 * t for t in times]})
        print(json.dumps(out[-1]), flush=True)
    if trace and out[-1]["chunk"]:
        prof = profile(dec, toks, out[-1]["chunk"])
        out[-1]["profile"] = prof
        print(f"\n== profile: N={N} chunk={out[-1]['chunk']}: device busy "
              f"{prof['device_busy_ms_per_step']:.1f} ms, span "
              f"{prof['device_span_ms_per_step']:.1f} ms, {prof['n_kernels_per_step']:.0f} kernels")
        for o in prof["top_ops"][:25]:
            print(f"  {o['ms_per_step']:>9.2f} ms {o['share']:>6.1%} x{o['calls_per_step']:<6.0f} "
                  f"{o['name'][:110]}")
        print("== host events (inclusive ms, count, thread: name)")
        for o in prof["host"]:
            print(f"  {o['ms_per_step']:>9.2f} ms x{o['calls_per_step']:<6.0f} {o['thread']}: "
                  f"{o['name']}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["nsa_125m", "dense_125m"])
    p.add_argument("--lengths", nargs="+", type=int, default=[32768, 65536])
    p.add_argument("--chunks", nargs="+", type=int, default=[8192, 16384])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--no-whole", action="store_true",
                   help="skip the prefill at once (its compile is ~75 s at 64k on an H200); "
                        "rel_rmse is then not measured")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for every model (e.g. exec.kernel.sel_fwd=query)")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="JAX's persistent compilation cache in DIR (nsa_jax.compile_cache): run "
                        "twice to time a compile read back from it (compile_s)")
    a = p.parse_args(argv)
    if a.compile_cache:
        compile_cache.enable(a.compile_cache, key="--compile-cache")
    if a.smoke:
        a.lengths, a.chunks, a.reps = [256], [64, 128], 1
    d = jax.devices()[0]
    res = {"device": getattr(d, "device_kind", d.platform), "jax": jax.__version__,
           "python": platform.python_version(), "smoke": a.smoke, "set": a.set,
           "xla_flags": os.environ.get("XLA_FLAGS", ""), "records": {}}
    for name in a.models:
        model = load_model(name, a.smoke, a.set)
        res["records"][name] = [r for N in a.lengths
                                for r in measure(model, N, a.chunks, a.reps, a.profile,
                                                 not a.no_whole)]
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, jax {res['jax']}; batch 1; ms = median of {a.reps} prefills")
    print(f"{'model':<11} {'N':>7} {'chunk':>7} {'ms':>9} {'sent ms':>8} {'tok/s':>10} "
          f"{'need MiB':>9} {'rel rmse':>9}")
    for name, recs in res["records"].items():
        for r in recs:
            r = dict(r, profile=None)
            need = "-" if r["need_mib"] is None else f"{r['need_mib']:.0f}"
            print(f"{name:<11} {r['N']:>7} {str(r['chunk'] or 'whole'):>7} {r['ms']:>9.1f} "
                  f"{r['dispatch_ms']:>8.1f} {r['tok_s']:>10.0f} {need:>9} "
                  f"{'-' if r['rel_rmse'] is None else format(r['rel_rmse'], '.2e'):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
