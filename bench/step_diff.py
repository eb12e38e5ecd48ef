"""Compare two ``bench/profile_step.py`` (or ``bench/gpu_hlo.sh``, or ``bench/profile_op.py``)
profiles: device busy per step (per op call), the categories, and the ops that moved.

    python bench/step_diff.py BEFORE.json AFTER.json [--min-ms 0.05] [--json OUT]

Points are matched by (model, seq_len, batch). Ops are matched by name first. XLA numbers its
fusions per compile, so a fusion that did not change can carry another name in the other
profile (``loop_convert_fusion_48`` -> ``_36``), and cuBLAS may pick another GEMM kernel for
the same matmul: an op found on one side only is paired with one on the other side of the
same category and calls per step whose time is within ``--rename-tol`` (5%), closest first,
and reported as renamed; so is an XLA-made name (a fusion, a copy) found on both sides whose time
moved by more than that, since XLA may have given its number to another op. Each profile lists only its top ops (``--top``), so an op missing
from one side may sit below that side's cut: it is reported with the cut as its bound, or, when
it is no longer than that cut, not compared at all.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# names that stay with one op between compiles: our Pallas kernels, cuDNN's and cuBLAS' kernels,
# memsets. Every other name is XLA's, numbered per compile (fusions, copies, wrapped ops, CPU
# ops): the same name in two profiles need not be the same op.
STABLE_NAMED = re.compile(r"^(nsa_|cudnn|void |nvjet|sm\d+_|Memset|Memcpy)")


def _xla_named(name: str) -> bool:
    return not STABLE_NAMED.match(name)


def load_points(path) -> dict:
    """{(model, seq_len, batch): point} of a profile JSON (points with an error skipped). A
    ``bench/profile_op.py`` profile (one op, no points) is one point, keyed ("op SHAPE", T, B)."""
    data = json.loads(Path(path).read_text())
    if "points" not in data and "device_busy_ms_per_step" in data and "shape" in data:
        return {(f"op {data['shape']}", data["T"], data["B"]): data}
    return {(p["model"], p["seq_len"], p["batch"]): p for p in data.get("points", [])
            if "error" not in p}


def _rel(a: dict, b: dict) -> float:
    return abs(a["ms_per_step"] - b["ms_per_step"]) / max(a["ms_per_step"], b["ms_per_step"],
                                                          1e-9)


def _pair_renamed(only_a: dict, only_b: dict, tol: float):
    """Greedy pairs (name_a, name_b) of ops seen on one side only: same category and calls per
    step, times within ``tol`` (relative), closest first."""
    cands = []
    for na, a in only_a.items():
        for nb, b in only_b.items():
            if a["category"] != b["category"] or a["calls_per_step"] != b["calls_per_step"]:
                continue
            rel = _rel(a, b)
            if rel <= tol:
                cands.append((rel, na, nb))
    pairs, used_a, used_b = [], set(), set()
    for _, na, nb in sorted(cands):
        if na not in used_a and nb not in used_b:
            pairs.append((na, nb))
            used_a.add(na)
            used_b.add(nb)
    return pairs


def diff_point(a: dict, b: dict, min_ms: float = 0.05, rename_tol: float = 0.05) -> dict:
    """The differences between one point's two profiles (a = before, b = after)."""
    ops_a = {o["name"]: o for o in a["top_ops"]}
    ops_b = {o["name"]: o for o in b["top_ops"]}
    cut_a = min((o["ms_per_step"] for o in a["top_ops"]), default=0.0)
    cut_b = min((o["ms_per_step"] for o in b["top_ops"]), default=0.0)
    same = set(ops_a) & set(ops_b)
    # an XLA-made name whose time moved beyond the tolerance may be another op under a reused
    # number: both sides go to the pairing instead
    reused = {n for n in same if _xla_named(n) and _rel(ops_a[n], ops_b[n]) > rename_tol}
    same -= reused
    only_a = {n: o for n, o in ops_a.items() if n not in same}
    only_b = {n: o for n, o in ops_b.items() if n not in same}
    renamed = _pair_renamed(only_a, only_b, rename_tol)
    rows = []
    for n in sorted(same):
        rows.append({"name": n, "before": ops_a[n]["ms_per_step"],
                     "after": ops_b[n]["ms_per_step"], "how": "same name"})
    for na, nb in renamed:
        rows.append({"name": na if na == nb else f"{na} -> {nb}",
                     "before": ops_a[na]["ms_per_step"],
                     "after": ops_b[nb]["ms_per_step"], "how": "renamed"})
        del only_a[na], only_b[nb]
    # an op in one list only, no longer than the other list's cut (+ tolerance), may simply sit
    # below that cut: not compared
    uncompared = 0
    for n, o in only_a.items():
        if o["ms_per_step"] <= cut_b * (1 + rename_tol):
            uncompared += 1
            continue
        rows.append({"name": n, "before": o["ms_per_step"], "after": None,
                     "how": f"only before (after: gone or <= {cut_b:.3f})"})
    for n, o in only_b.items():
        if o["ms_per_step"] <= cut_a * (1 + rename_tol):
            uncompared += 1
            continue
        rows.append({"name": n, "before": None, "after": o["ms_per_step"],
                     "how": f"only after (before: new or <= {cut_a:.3f})"})
    for r in rows:
        r["delta"] = (r["after"] or 0.0) - (r["before"] or 0.0)
    rows = sorted((r for r in rows if abs(r["delta"]) >= min_ms), key=lambda r: r["delta"])
    cats = sorted(set(a["by_category"]) | set(b["by_category"]))
    get = lambda p, c: p["by_category"].get(c, {}).get("ms_per_step", 0.0)
    return {
        "busy": (a["device_busy_ms_per_step"], b["device_busy_ms_per_step"]),
        "categories": {c: (get(a, c), get(b, c)) for c in cats},
        "ops": rows, "renamed": renamed, "uncompared": uncompared,
    }


def _fmt(x):
    return "-" if x is None else f"{x:.3f}"


def print_diff(key, d: dict) -> None:
    (ba, bb) = d["busy"]
    print(f"== {key[0]} T={key[1]} B={key[2]}: device busy {ba:.2f} -> {bb:.2f} ms/step "
          f"({bb - ba:+.2f} ms, {(bb - ba) / ba:+.2%})")
    for c, (x, y) in d["categories"].items():
        print(f"  {c:<32} {x:>8.2f} -> {y:>8.2f}  ({y - x:+.2f})")
    print(f"  ops that moved (ms per step, before -> after; {d['uncompared']} ops in one top list "
          f"only, within the other's cut, not compared):")
    for r in d["ops"]:
        print(f"  {r['delta']:+8.3f}  {_fmt(r['before']):>8} -> {_fmt(r['after']):>8}  "
              f"{r['name'][:90]}  [{r['how']}]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--min-ms", type=float, default=0.05,
                    help="hide ops that moved less than this (ms per step)")
    ap.add_argument("--rename-tol", type=float, default=0.05,
                    help="relative time within which two ops on one side each are paired")
    ap.add_argument("--json", help="write the differences here")
    a = ap.parse_args(argv)
    pa, pb = load_points(a.before), load_points(a.after)
    keys = [k for k in pa if k in pb]
    if not keys:
        print(f"step_diff: no point is in both {a.before} ({sorted(pa)}) and {a.after} "
              f"({sorted(pb)})", file=sys.stderr)
        return 2
    out = {}
    for k in keys:
        d = diff_point(pa[k], pb[k], a.min_ms, a.rename_tol)
        print_diff(k, d)
        out[":".join(map(str, k))] = d
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
