"""Profile train steps with ``jax.profiler`` and summarise the device time by op and by kernel.

    PYTHONPATH=. python bench/profile_step.py [--models nsa_125m dense_125m]
        [--points 65536:1 2048:16] [--steps 2] [--out bench/results/profile_<dev>.json]
        [--trace-dir DIR] [--top 25] [--override KEY=VALUE ...] [--smoke]

For each (model, T, B) point it builds the product's train step exactly like
``bench/train_throughput.py`` (same configs, synthetic tokens), compiles it, runs 2 warm-up
steps, then records ``--steps`` steps under ``jax.profiler.trace(..., create_perfetto_trace=True)``
and reads the Perfetto JSON that the profiler writes. Device events (processes named
``/device:GPU:N``) are grouped two ways:

* by XLA op (the profiler's "XLA Ops" line: one event per HLO instruction, e.g. a fusion, a
  cuBLAS gemm custom call, a Pallas/Triton custom call), and
* by kernel (the stream lines: one event per CUDA kernel launch, named by the kernel).

Times are per step (total / steps) in ms, with the share of the device-busy time. Ops are also
put in coarse categories by name (attention kernels, matmul, fusion, collective, copy, other)
so the table reads at a glance. With no GPU process in the trace (CPU), the host threads'
events stand in so that ``--smoke`` exercises the parser.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import jax  # noqa: E402

from train_throughput import build_point, device_name  # noqa: E402

CATEGORIES = (   # first match wins; matched against the op or kernel name, lower-cased
    ("collective", r"all-reduce|all-gather|reduce-scatter|all-to-all|nccl|collective"),
    ("attention (pallas/triton)", r"nsa_|_sel_|_cmp_|topn|pallas|triton|score"),
    ("attention (cudnn)", r"cudnn|fmha|flash|cudnn_fmha|sm90_fmha|dot_product_attention"),
    ("matmul (cublas/gemm)", r"gemm|cublas|nvjet|matmul|dot|sm90_xmma|cutlass"),
    ("copy / layout", r"copy|transpose|memcpy|memset|dynamic-update-slice|slice|pad|concatenate"),
    ("fusion (elementwise/reduce)", r"fusion|reduce|loop_|input_"),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def load_trace(trace_dir: str) -> dict:
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True))
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(files[-1], "rt") as f:
        return json.load(f)


def _names(trace):
    """(events, process names by pid, thread names by (pid, tid), the GPU's pids) of a trace."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    pname, tname = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e["args"]["name"]
    return events, pname, tname, {p for p, n in pname.items() if "GPU" in n or "gpu" in n}


def summarise(trace: dict, steps: int, top: int) -> dict:
    events, pname, tname, gpu = _names(trace)
    use = gpu or set(pname)            # CPU: host threads stand in
    ops, kernels = collections.Counter(), collections.Counter()
    op_n, k_n = collections.Counter(), collections.Counter()
    lines = collections.Counter()
    first, last = float("inf"), float("-inf")
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in use or "dur" not in e:
            continue
        thread = tname.get((e["pid"], e.get("tid")), "")
        lines[thread] += e["dur"]
        if "XLA Ops" in thread:
            ops[e["name"]] += e["dur"]
            op_n[e["name"]] += 1
        elif "Stream" in thread or not gpu:
            kernels[e["name"]] += e["dur"]
            k_n[e["name"]] += 1
            first, last = min(first, e["ts"]), max(last, e["ts"] + e["dur"])
    if not ops:            # no op line (CPU, or an older profiler): the kernels are the ops
        ops, op_n = kernels, k_n
    busy = sum(kernels.values()) or sum(ops.values()) or 1.0

    def table(counter, counts):
        total = sum(counter.values()) or 1.0
        return [{"name": n[:160], "ms_per_step": us / 1e3 / steps, "share": us / total,
                 "calls_per_step": counts[n] / steps, "category": category(n)}
                for n, us in counter.most_common(top)]

    cats = collections.Counter()
    for n, us in (kernels or ops).items():
        cats[category(n)] += us
    span = last - first if last > first else busy
    return {"device_busy_ms_per_step": busy / 1e3 / steps,
            # first kernel's start to last kernel's end: busy time plus the gaps between kernels
            "device_span_ms_per_step": span / 1e3 / steps,
            "by_category": {c: {"ms_per_step": us / 1e3 / steps, "share": us / busy}
                            for c, us in cats.most_common()},
            "top_ops": table(ops, op_n), "top_kernels": table(kernels, k_n),
            "n_kernels_per_step": sum(k_n.values()) / steps,
            "lines_ms": {t: us / 1e3 / steps for t, us in lines.most_common(12)},
            "gpu_trace": bool(gpu)}


def host_events(trace: dict, steps: int, top: int) -> list[dict]:
    """The host threads' events (every process but the GPU's), summed by (thread, name): ms per
    step and count, most first. Events nest (a thunk inside an execute call), so the sums are
    inclusive times, not a partition of the host's time."""
    events, _, tname, gpu = _names(trace)
    us, n = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("pid") in gpu or "dur" not in e:
            continue
        key = (tname.get((e["pid"], e.get("tid")), "?")[:40], e["name"][:100])
        us[key] += e["dur"]
        n[key] += 1
    return [{"thread": t, "name": k, "ms_per_step": v / 1e3 / steps,
             "calls_per_step": n[t, k] / steps} for (t, k), v in us.most_common(top)]


def profile_point(name, T, B, steps, smoke, trace_root, top, extra=()) -> dict:
    cfg, devices, step, state, batches = build_point(name, T, B, steps, smoke, None, 1, extra)
    step = step.lower(state, batches[0]).compile()
    for i in range(2):
        state, stats = step(state, batches[i % 4])
    jax.block_until_ready(stats["loss"])
    trace_dir = os.path.join(trace_root, f"{name}_{T}x{B}")
    t0 = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for i in range(steps):
            state, stats = step(state, batches[i % 4])
        jax.block_until_ready(stats["loss"])
    wall = (time.perf_counter() - t0) / steps
    summary = summarise(load_trace(trace_dir), steps, top)
    return {"model": name, "seq_len": T, "batch": B, "steps": steps, "overrides": list(extra),
            "wall_ms_per_step_profiled": wall * 1e3, **summary}


def print_summary(r: dict, top: int) -> None:
    print(f"\n== {r['model']} T={r['seq_len']} B={r['batch']}: device busy "
          f"{r['device_busy_ms_per_step']:.1f} ms/step (wall {r['wall_ms_per_step_profiled']:.1f}"
          f" ms/step under the profiler), {r['n_kernels_per_step']:.0f} kernels/step")
    for c, v in r["by_category"].items():
        print(f"  {c:<30} {v['ms_per_step']:>9.2f} ms {v['share']:>6.1%}")
    print("  top ops:")
    for o in r["top_ops"][:top]:
        print(f"  {o['ms_per_step']:>9.2f} ms {o['share']:>6.1%} x{o['calls_per_step']:<5.0f} "
              f"{o['category'][:12]:<12} {o['name'][:90]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["nsa_125m", "dense_125m"])
    ap.add_argument("--points", nargs="+", default=["65536:1", "2048:16"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out")
    ap.add_argument("--trace-dir", help="keep the raw traces here (default: a temporary dir)")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for every point (e.g. exec.kernel.cmp_pallas_max_t=0)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke and a.points == ap.get_default("points"):
        a.points = ["128:2"]
    out = Path(a.out or REPO / "bench" / "results" /
               f"profile_{device_name()}{'_smoke' if a.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "points": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = a.trace_dir or tmp
        for pt in a.points:
            T, B = (int(x) for x in pt.split(":"))
            for name in a.models:
                try:
                    r = profile_point(name, T, B, a.steps, a.smoke, root, a.top,
                                      tuple(a.override))
                except Exception as e:  # noqa: BLE001 - one failed point must not lose the rest
                    r = {"model": name, "seq_len": T, "batch": B,
                         "error": str(e).splitlines()[0][:300]}
                    print(f"{name} {pt}: ERROR {r['error']}", flush=True)
                res["points"].append(r)
                out.write_text(json.dumps(res, indent=1))
    for r in res["points"]:
        if "error" not in r:
            print_summary(r, min(a.top, 15))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
