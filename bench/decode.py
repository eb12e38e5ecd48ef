"""Decode-step latency with KV caches: nsa_125m vs dense_125m at long contexts (GPU).

    PYTHONPATH=. python bench/decode.py [--out bench/results/decode_<device>.json]
        [--contexts 8192 16384 32768 65536] [--batches 1 8] [--reps 50] [--smoke]

For each model config (configs/nsa_125m.yaml, configs/dense_125m.yaml: bf16, 12 layers, random
parameters), batch B and context N, the caches are filled with random keys/values as after a
prompt of N-1 tokens (prefill itself is not timed), then ``decode_step`` (the jitted step of
:class:`nsa_jax.decode.Decoder`, caches donated and updated in place) is called repeatedly, each
call feeding one token per sequence and reading its logits. The number is the median wall time of
``--reps`` steps (block_until_ready on the logits) after a compile call and warm-up steps;
positions advance N-1, N, ... so the context is N..N+reps. Also recorded per point: tokens/s
(B / step time) and the analytic keys read per KV head at position N-1
(``nsa_jax.decode.decode_reads``, exact convention, and N for dense). The JSON is rewritten after
every point.

``--smoke`` shrinks the models (2 layers, dim 64) and contexts (256, 512) and uses batches 1 and
2 and 3 reps, so it runs on the CPU in under a minute: a check that the script works, not a
measurement to report.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.decode import _step_jit, decode_reads, dense_reads, init_cache  # noqa: E402
from nsa_jax.model import build_model, count_params  # noqa: E402

MODELS = ("nsa_125m", "dense_125m")
SMOKE_MODEL = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_groups": 2, "head_dim": 16,
               "mlp_hidden": 128, "vocab_size": 512}


def device_name() -> str:
    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform).lower()
    for tag in ("h200", "h100", "a100", "l40", "a10"):
        if tag in kind:
            return tag
    return d.platform


def load_model(name: str, smoke: bool):
    overrides = [f"model.{k}={v}" for k, v in SMOKE_MODEL.items()] if smoke else []
    if smoke:
        overrides.append("model.compute_dtype=float32")
    cfg = load_config(REPO / "configs" / f"{name}.yaml", overrides)
    return cfg, build_model(cfg.model, cfg.nsa, seed=0)


def random_cache(model, batch: int, max_len: int, pos: int, seed: int):
    """Caches of the right shapes and dtype filled with N(0,1) values, positioned at ``pos``."""
    cache = init_cache(model, batch, max_len)
    leaves, tree = jax.tree.flatten(cache["layers"])
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    filled = [jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)
              for k, x in zip(keys, leaves)]
    return {"pos": jnp.asarray(pos, jnp.int32), "layers": jax.tree.unflatten(tree, filled)}


def time_steps(graphdef, state, cache, batch, vocab, reps, warmup):
    tok = jnp.zeros((batch,), jnp.int32)
    t0 = time.perf_counter()
    logits, cache = _step_jit(graphdef, state, cache, tok)
    jax.block_until_ready(logits)
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        logits, cache = _step_jit(graphdef, state, cache, tok)
        jax.block_until_ready(logits)
    ts = []
    for i in range(reps):
        tok = jnp.full((batch,), i % vocab, jnp.int32)
        t0 = time.perf_counter()
        logits, cache = _step_jit(graphdef, state, cache, tok)
        jax.block_until_ready(logits)
        ts.append(time.perf_counter() - t0)
    return ts, compile_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/"
                    "decode_<device>.json, decode_<device>_smoke.json with --smoke)")
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU-sized run (not a measurement)")
    a = ap.parse_args(argv)
    contexts = a.contexts or ([256, 512] if a.smoke else [8192, 16384, 32768, 65536])
    batches = a.batches or ([1, 2] if a.smoke else [1, 8])
    reps = a.reps or (3 if a.smoke else 50)
    dev = device_name()
    out = Path(a.out or REPO / "bench" / "results" /
               f"decode_{dev}{'_smoke' if a.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    result = {
        "benchmark": "decode-step latency with KV caches (nsa_jax.decode)",
        "device": str(jax.devices()[0].device_kind if hasattr(jax.devices()[0], "device_kind")
                      else jax.devices()[0]),
        "backend": jax.default_backend(), "jax": jax.__version__,
        "python": platform.python_version(), "smoke": a.smoke,
        "reps": reps, "warmup": a.warmup, "models": {}, "points": [],
    }
    for name in a.models:
        cfg, model = load_model(name, a.smoke)
        graphdef, state = nnx.split(model)
        result["models"][name] = {"model": dataclasses.asdict(cfg.model),
                                  "nsa": cfg.to_dict()["nsa"], "params": count_params(model)}
        for N in contexts:
            for B in batches:
                max_len = N + a.warmup + reps + 1
                cache = random_cache(model, B, max_len, pos=N - 1, seed=N + B)
                try:
                    ts, compile_s = time_steps(graphdef, state, cache, B, cfg.model.vocab_size,
                                               reps, a.warmup)
                except Exception as e:  # noqa: BLE001 - e.g. out of memory: record and go on
                    msg = " ".join(str(e).split())[:300]
                    print(f"{name} N={N} B={B}: failed ({type(e).__name__}: {msg})", flush=True)
                    result["points"].append({"model": name, "context": N, "batch": B,
                                             "error": f"{type(e).__name__}: {msg}"})
                    out.write_text(json.dumps(result, indent=1))
                    continue
                del cache
                med = statistics.median(ts) * 1e3
                reads = (decode_reads(N - 1, cfg.nsa)["total"]
                         if cfg.model.attention == "nsa" else dense_reads(N - 1))
                pt = {"model": name, "attention": cfg.model.attention, "context": N, "batch": B,
                      "step_ms_median": med, "step_ms_min": min(ts) * 1e3,
                      "step_ms_max": max(ts) * 1e3, "tokens_per_s": B / (med / 1e3),
                      "compile_s": compile_s, "keys_read_per_kv_head": reads}
                result["points"].append(pt)
                print(f"{name:10s} N={N:6d} B={B:2d}  step {med:8.3f} ms  "
                      f"({pt['tokens_per_s']:9.1f} tok/s)  keys/head {reads}", flush=True)
                out.write_text(json.dumps(result, indent=1))
    # NSA / dense ratios where both were measured
    by = {(p["model"], p["context"], p["batch"]): p for p in result["points"] if "error" not in p}
    result["speedup_nsa_vs_dense"] = [
        {"context": N, "batch": B,
         "dense_over_nsa": by[("dense_125m", N, B)]["step_ms_median"]
         / by[("nsa_125m", N, B)]["step_ms_median"]}
        for N in contexts for B in batches
        if ("dense_125m", N, B) in by and ("nsa_125m", N, B) in by]
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
