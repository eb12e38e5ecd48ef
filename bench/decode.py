"""Decode-step latency with KV caches: nsa_125m vs dense_125m over contexts and batches (GPU).

    PYTHONPATH=. python bench/decode.py [--out bench/results/decode_<device>.json]
        [--contexts 8192 32768 65536 131072] [--batches 1 8 32 64] [--reps 30]
        [--models nsa_125m dense_125m] [--set exec.decode_impl=reference ...]
        [--profile 65536:1 65536:8] [--hlo] [--ragged] [--smoke]

For each model (configs/nsa_125m.yaml, configs/dense_125m.yaml: bf16, 12 layers, random
parameters), batch B and context N: caches with room for every timed and profiled step
(``max_len = N + warm-up + reps + 60 + 16 * 7`` tokens; checked before each profile) are filled
with random keys/values as after a prompt of N-1 tokens (prefill is not timed), then the jitted decode step (:func:`nsa_jax.decode.step_jit`:
one call for all layers, caches donated, bf16 inference weights from
:func:`nsa_jax.decode.inference_state` and :func:`nsa_jax.decode.step_state`) is called
repeatedly, one token per row; positions advance from N-1 (``--ragged``: row b from
N-1 - (b mod d), d = the stride: every step some rows end a compressed block, and with B >= 16
rows (d of them per φ row tile of 32 (row, group) pairs at G = 2) every tile has one; without
it all rows end one together every d steps, the case where the step's φ emission skips its
work on d - 1 steps of d). Recorded per point:

* ``step_ms``: median of ``--reps`` steps, each synchronised (block_until_ready on the logits),
  i.e. the latency a sampling loop sees; ``stream_ms``: per-step time of 10 steps issued back to
  back and synchronised once (median of 5 rounds), closer to device time; ``loop_ms``: per-token
  time of one call of the jitted decode loop (:func:`nsa_jax.decode_loop.decode_loop_jit`, what
  ``generate_batch`` runs) of ``loop_k`` = 16 tokens per row, greedy sampling included, each
  call synchronised once (median of 5 calls after one that compiles);
* ``floor_bytes``: what the step must read at least: the inference weights once plus, per layer,
  the keys and values the attention reads (NSA: visible compressed blocks + n·l' selected tokens
  + the window; dense: the whole context), and ``floor_ms`` at 4.3 TB/s; ``achieved_gbs`` =
  floor_bytes / step time;
* with ``--hlo``: the compiled step's temporary bytes against the cache bytes and the copies of
  cache-shaped buffers in the optimised HLO (0 when the donated caches are updated in place).

``--profile N:B ...`` traces 5 steps of those points with ``jax.profiler`` and sums device time
per kernel and category (``bench/profile_step.py``'s summariser), and the same per token of one
decode-loop call (``loop_profile``: busy time, and the device span with the gaps between
kernels). XLA flags (e.g. CUDA-graph command buffers on/off) come from the environment's ``XLA_FLAGS``, recorded in the JSON.
``--smoke`` shrinks the models and contexts so the script runs on the CPU (not a measurement).
Each model's record names the backend its decode attention resolved to (``decode_backend``: on a GPU
``pallas`` for both models -- dense on ``pallas.decode_dense`` since the twenty-seventh session, so
grids before it compared against dense in XLA -- else ``reference``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.decode import (cache_bytes, decode_loop_jit, inference_state,  # noqa: E402
                            init_cache, step_jit, step_state)

try:  # the read counters' module (older trees, timed with this script, had them in decode)
    from nsa_jax.nsa.reads import decode_reads, dense_reads  # noqa: E402
except ImportError:
    from nsa_jax.decode import decode_reads, dense_reads  # noqa: E402

try:  # the steps' flat state (an older tree, timed with this script, has none)
    from nsa_jax.decode import flat_state  # noqa: E402
except ImportError:
    def flat_state(graphdef, state):
        return graphdef, state
from nsa_jax.model import build_model, count_params, resolve_nsa_impl  # noqa: E402

MODELS = ("nsa_125m", "dense_125m")
SMOKE_MODEL = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_groups": 2, "head_dim": 16,
               "mlp_hidden": 128, "vocab_size": 512}
HBM_BPS = 4.3e12
LOOP_K, LOOP_CALLS = 16, 5      # loop_ms: tokens per call, timed calls (after a compiling one)


def device_name() -> str:
    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform).lower()
    for tag in ("h200", "h100", "a100", "l40", "a10"):
        if tag in kind:
            return tag
    return d.platform


def load_model(name: str, smoke: bool, sets: list[str]):
    overrides = [f"model.{k}={v}" for k, v in SMOKE_MODEL.items()] if smoke else []
    if smoke:
        overrides.append("model.compute_dtype=float32")
    cfg = load_config(REPO / "configs" / f"{name}.yaml", overrides + list(sets))
    return cfg, build_model(cfg.model, cfg.nsa, seed=0, exec_cfg=cfg.exec)


def random_cache(model, batch: int, max_len: int, pos: int, seed: int, spread: int = 1):
    """Caches of the right shapes and dtype filled with N(0,1) values, row b at
    ``pos - b % spread``; the integer leaves (the Pallas kernels' completion counters) stay 0."""
    cache = init_cache(model, batch, max_len)
    leaves, tree = jax.tree.flatten(cache["layers"])
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    fill = jax.jit(lambda k, x: jax.random.normal(k, x.shape, x.dtype), donate_argnums=1)
    filled = [fill(k, x) if jnp.issubdtype(x.dtype, jnp.floating) else x
              for k, x in zip(keys, leaves)]
    return {"pos": pos - jnp.arange(batch, dtype=jnp.int32) % spread,
            "layers": jax.tree.unflatten(tree, filled)}


def floor_bytes(cfg, model_bytes: int, N: int, B: int, itemsize: int) -> int:
    """Least bytes a step at context N must read: weights + the keys/values the attention uses."""
    m = cfg.model
    kv_row = 2 * m.head_dim * itemsize * m.n_kv_groups
    keys = decode_reads(N - 1, cfg.nsa)["total"] if m.attention == "nsa" else dense_reads(N - 1)
    return model_bytes + m.n_layers * B * keys * kv_row


def hlo_check(graphdef, state, cache, tok, dump: str | None = None) -> dict:
    compiled = step_jit.lower(graphdef, state, cache, tok).compile()
    ma = compiled.memory_analysis()
    text = compiled.as_text()
    if dump:
        Path(dump).write_text(text)
    shapes = {f"{x.dtype.name if x.dtype != jnp.bfloat16 else 'bf16'}[{','.join(map(str, x.shape))}]"
              for x in jax.tree.leaves(cache["layers"])}
    shapes = {s.replace("float32", "f32") for s in shapes}
    copies = [ln.strip()[:200] for ln in text.splitlines()
              if re.search(r"= \S+ copy(-start)?\(", ln) and any(s in ln for s in shapes)]
    return {"temp_bytes": int(getattr(ma, "temp_size_in_bytes", -1)),
            "alias_bytes": int(getattr(ma, "alias_size_in_bytes", -1)),
            "cache_bytes": cache_bytes(cache), "cache_copies": len(copies),
            "cache_copy_lines": copies[:5]}


def time_point(graphdef, state, cache, B, vocab, reps, warmup):
    tok = jnp.zeros((B,), jnp.int32)
    t0 = time.perf_counter()
    logits, cache = step_jit(graphdef, state, cache, tok)
    jax.block_until_ready(logits)
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        logits, cache = step_jit(graphdef, state, cache, tok)
    jax.block_until_ready(logits)
    ts = []
    for i in range(reps):
        tok = jnp.full((B,), i % vocab, jnp.int32)
        t0 = time.perf_counter()
        logits, cache = step_jit(graphdef, state, cache, tok)
        jax.block_until_ready(logits)
        ts.append(time.perf_counter() - t0)
    return ts, compile_s, cache


def stream_time(graphdef, state, cache, B, rounds=5, n=10):
    tok = jnp.ones((B,), jnp.int32)
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            logits, cache = step_jit(graphdef, state, cache, tok)
        jax.block_until_ready(logits)
        per.append((time.perf_counter() - t0) / n)
    return statistics.median(per), cache


def loop_time(graphdef, state, cache, B, vocab):
    """Per-token seconds of one decode-loop call of LOOP_K greedy tokens (median of LOOP_CALLS
    calls, each synchronised on its ids; one call before them compiles)."""
    logits = jnp.zeros((B, vocab), jnp.float32)
    key, done = jax.random.PRNGKey(0), jnp.zeros((B,), bool)
    per = []
    for i in range(LOOP_CALLS + 1):
        t0 = time.perf_counter()
        ids, logits, cache, key, done = decode_loop_jit(graphdef, state, cache, logits, key,
                                                        done, steps=LOOP_K, temperature=0.0)
        jax.block_until_ready((ids, logits))
        if i:
            per.append((time.perf_counter() - t0) / LOOP_K)
    return statistics.median(per), cache


def _traced(run, cache, max_len: int, steps: int) -> tuple[dict, dict]:
    """``run(cache) -> (outputs, cache)`` advancing ``steps`` tokens, under ``jax.profiler``:
    -> (the trace summarised per token, the cache). Refused where it would run past the caches'
    ``max_len`` (the Pallas cache writes have no bounds check)."""
    from profile_step import load_trace, summarise
    last = int(jnp.max(cache["pos"])) + steps
    if last > max_len:
        raise RuntimeError(f"{steps} more steps reach position {last} > max_len={max_len}")
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            out, cache = run(cache)
            jax.block_until_ready(out)
        return summarise(load_trace(d), steps, top=60), cache


def profile(graphdef, state, cache, B, max_len: int, steps=5) -> tuple[dict, dict]:
    """``steps`` decode steps (``step_jit``) traced: device time per step."""
    tok = jnp.ones((B,), jnp.int32)

    def run(cache):
        for _ in range(steps):
            logits, cache = step_jit(graphdef, state, cache, tok)
        return logits, cache
    return _traced(run, cache, max_len, steps)


def profile_loop(graphdef, state, cache, B, vocab, max_len: int) -> tuple[dict, dict]:
    """One decode-loop call of LOOP_K tokens (compiled by ``loop_time``) traced, per token:
    every step's share of emissions, and the device span with the gaps."""
    logits = jnp.zeros((B, vocab), jnp.float32)
    key, done = jax.random.PRNGKey(1), jnp.zeros((B,), bool)

    def run(cache):
        ids, out, cache, _, _ = decode_loop_jit(graphdef, state, cache, logits, key, done,
                                                steps=LOOP_K, temperature=0.0)
        return (ids, out), cache
    return _traced(run, cache, max_len, LOOP_K)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for every model")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", nargs="*", default=[], help="N:B points to trace")
    ap.add_argument("--hlo", action="store_true", help="check in-place cache updates in the HLO")
    ap.add_argument("--ragged", action="store_true",
                    help="rows at positions N-1 - (b mod stride): emissions spread over steps")
    ap.add_argument("--hlo-dump", default=None, help="directory for the optimised HLO text")
    ap.add_argument("--max-dense-bytes", type=float, default=60e9,
                    help="skip dense points whose caches exceed this many bytes")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU-sized run (not a measurement)")
    a = ap.parse_args(argv)
    contexts = a.contexts or ([256, 512] if a.smoke else [8192, 32768, 65536, 131072])
    batches = a.batches or ([1, 2] if a.smoke else [1, 8, 32, 64])
    reps = a.reps or (3 if a.smoke else 30)
    prof = {tuple(int(v) for v in p.split(":")) for p in a.profile}
    dev = device_name()
    out = Path(a.out or REPO / "bench" / "results" /
               f"decode_{dev}{'_smoke' if a.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    d0 = jax.devices()[0]
    result = {"benchmark": ("decode-step latency with KV caches (nsa_jax.decode.step_jit; "
                           "loop_ms: nsa_jax.decode_loop.decode_loop_jit)"),
              "device": str(getattr(d0, "device_kind", d0)), "backend": jax.default_backend(),
              "jax": jax.__version__, "python": platform.python_version(), "smoke": a.smoke,
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "sets": a.set, "reps": reps,
              "ragged": a.ragged,
              "warmup": a.warmup, "models": {}, "points": []}

    def save():
        out.write_text(json.dumps(result, indent=1))

    for name in a.models:
        cfg, model = load_model(name, a.smoke, a.set)
        # what Decoder.step / Decoder.decode run with (the steps' own graph and state)
        graphdef, state = flat_state(*step_state(model, inference_state(model)[1]))
        model_bytes = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(state))
        result["models"][name] = {"model": dataclasses.asdict(cfg.model),
                                  "nsa": cfg.to_dict()["nsa"], "exec": cfg.to_dict()["exec"],
                                  "params": count_params(model),
                                  "inference_weight_bytes": model_bytes,
                                  # the decode attention's backend (both models: the Pallas kernels,
                                  # dense on its flash-decoding kernel, or XLA / jax.numpy)
                                  "decode_backend": resolve_nsa_impl(cfg.exec.decode_impl)}
        item = jnp.dtype(model.dtype).itemsize
        for N in contexts:
            for B in batches:
                # 1 compiling step, warm-up, reps, 5 x 10 streamed, the loop calls, 5 profiled
                # steps and one profiled loop call
                max_len = N + a.warmup + reps + 60 + LOOP_K * (LOOP_CALLS + 2)
                pt = {"model": name, "attention": cfg.model.attention, "context": N, "batch": B}
                est = (cfg.model.n_layers * B * 2 * cfg.model.n_kv_groups * max_len
                       * cfg.model.head_dim * item)
                if cfg.model.attention == "dense" and est > a.max_dense_bytes:
                    pt["skipped"] = f"dense caches {est / 1e9:.1f} GB > --max-dense-bytes"
                    result["points"].append(pt)
                    print(f"{name:10s} N={N:6d} B={B:2d}  skipped ({pt['skipped']})", flush=True)
                    continue
                try:
                    cache = random_cache(model, B, max_len, pos=N - 1, seed=N + B,
                                         spread=cfg.nsa.stride_d if a.ragged else 1)
                    if a.hlo:
                        dump = (os.path.join(a.hlo_dump, f"{name}_{N}_{B}.hlo.txt")
                                if a.hlo_dump else None)
                        pt["hlo"] = hlo_check(graphdef, state, cache,
                                              jnp.zeros((B,), jnp.int32), dump)
                    ts, compile_s, cache = time_point(graphdef, state, cache, B,
                                                      cfg.model.vocab_size, reps, a.warmup)
                    stream_s, cache = stream_time(graphdef, state, cache, B)
                    loop_s, cache = loop_time(graphdef, state, cache, B, cfg.model.vocab_size)
                    if (N, B) in prof:
                        pt["profile"], cache = profile(graphdef, state, cache, B, max_len)
                        pt["loop_profile"], cache = profile_loop(graphdef, state, cache, B,
                                                                 cfg.model.vocab_size, max_len)
                    del cache
                except Exception as e:  # noqa: BLE001 - e.g. out of memory: record and go on
                    msg = " ".join(str(e).split())[:300]
                    pt["error"] = f"{type(e).__name__}: {msg}"
                    print(f"{name} N={N} B={B}: failed ({pt['error']})", flush=True)
                    result["points"].append(pt)
                    save()
                    continue
                med = statistics.median(ts) * 1e3
                fb = floor_bytes(cfg, model_bytes, N, B, item)
                pt.update(step_ms=med, step_ms_min=min(ts) * 1e3, stream_ms=stream_s * 1e3,
                          loop_ms=loop_s * 1e3, loop_k=LOOP_K,
                          tokens_per_s=B / (med / 1e3), compile_s=compile_s,
                          floor_bytes=fb, floor_ms=fb / HBM_BPS * 1e3,
                          achieved_gbs=fb / (stream_s * 1e9),
                          keys_read_per_kv_head=(decode_reads(N - 1, cfg.nsa)["total"]
                                                 if cfg.model.attention == "nsa"
                                                 else dense_reads(N - 1)))
                result["points"].append(pt)
                print(f"{name:10s} N={N:6d} B={B:2d}  step {med:8.3f} ms  stream "
                      f"{stream_s * 1e3:8.3f} ms  loop {loop_s * 1e3:8.3f} ms  "
                      f"floor {pt['floor_ms']:6.3f} ms  "
                      f"{pt['achieved_gbs']:7.1f} GB/s"
                      + (f"  hlo copies {pt['hlo']['cache_copies']} temp "
                         f"{pt['hlo']['temp_bytes'] / 1e6:.1f} MB" if "hlo" in pt else ""),
                      flush=True)
                if "loop_profile" in pt:
                    lp = pt["loop_profile"]
                    print(f"{'':10s} loop profile: busy {lp['device_busy_ms_per_step']:.3f} ms, "
                          f"span {lp['device_span_ms_per_step']:.3f} ms, "
                          f"{lp['n_kernels_per_step']:.0f} kernels per token", flush=True)
                save()
    result["speedup_nsa_vs_dense"] = speedups(result["points"])
    save()
    print_speedups(result)
    print(f"wrote {out}")
    return 0


def speedups(points) -> list[dict]:
    """dense / NSA time ratios (synced step, stream, loop) at every (context, batch) that has a
    point of both models, in context then batch order."""
    by = {(p["model"], p["context"], p["batch"]): p for p in points if "step_ms" in p}
    keys = sorted({(N, B) for (_, N, B) in by})
    return [
        {"context": N, "batch": B,
         "dense_over_nsa": by[("dense_125m", N, B)]["step_ms"] / by[("nsa_125m", N, B)]["step_ms"],
         "dense_over_nsa_stream": by[("dense_125m", N, B)]["stream_ms"]
         / by[("nsa_125m", N, B)]["stream_ms"],
         "dense_over_nsa_loop": by[("dense_125m", N, B)]["loop_ms"]
         / by[("nsa_125m", N, B)]["loop_ms"]}
        for N, B in keys if ("dense_125m", N, B) in by and ("nsa_125m", N, B) in by]


def print_speedups(result) -> None:
    by = {(p["model"], p["context"], p["batch"]): p for p in result["points"] if "step_ms" in p}
    print("\n  N      B   nsa ms   dense ms  dense/nsa (synced)  dense/nsa (stream)  "
          "nsa loop ms  dense loop ms  dense/nsa (loop)")
    for r in result["speedup_nsa_vs_dense"]:
        N, B = r["context"], r["batch"]
        print(f"{N:7d} {B:3d} {by[('nsa_125m', N, B)]['step_ms']:8.3f} "
              f"{by[('dense_125m', N, B)]['step_ms']:9.3f} {r['dense_over_nsa']:10.2f}x "
              f"{r['dense_over_nsa_stream']:14.2f}x "
              f"{by[('nsa_125m', N, B)]['loop_ms']:12.3f} "
              f"{by[('dense_125m', N, B)]['loop_ms']:14.3f} {r['dense_over_nsa_loop']:12.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
