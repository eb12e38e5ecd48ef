"""One line per point of a ``bench/decode.py`` JSON: the loop and synced-step ms per token, the
traced loop's busy and span (with ``--profile``), and one kernel's device us per token; with
``--top N`` also the traced loop's kernels per token and its N largest kernels.

    python bench/decode_summary.py decode.json TAG [--kernel nsa_cache_write] [--top 16]
"""
from __future__ import annotations

import argparse
import json


def lines(doc: dict, tag: str, kernel: str) -> list[str]:
    out = []
    for p in doc["points"]:
        lp = p.get("loop_profile", {})
        us = 1e3 * sum(k["ms_per_step"] for k in lp.get("top_kernels", []) if k["name"] == kernel)
        out.append(f"{tag:7s} {p['model']} N={p['context']} B={p['batch']}: loop "
                   f"{p.get('loop_ms', 0):.3f} ms, step {p.get('step_ms', 0):.3f}, loop busy "
                   f"{lp.get('device_busy_ms_per_step', 0):.3f}, span "
                   f"{lp.get('device_span_ms_per_step', 0):.3f}, {kernel} {us:.1f} us per token")
    return out


def top_lines(doc: dict, top: int) -> list[str]:
    """Per traced point: its kernels per token, then its ``top`` largest kernels (us per token)."""
    out = []
    for p in doc["points"]:
        lp = p.get("loop_profile")
        if not lp:
            continue
        out.append(f"{p['model']} N={p['context']} B={p['batch']}: kernels per token "
                   f"{lp.get('n_kernels_per_step', 0):.1f}")
        out += [f"   {k['ms_per_step'] * 1e3:8.1f} us  x{k['calls_per_step']:5.1f}  "
                f"{k['name'][:90]}" for k in lp.get("top_kernels", [])[:top]]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("tag")
    p.add_argument("--kernel", default="nsa_cache_write")
    p.add_argument("--top", type=int, default=0)
    a = p.parse_args(argv)
    with open(a.json) as fh:
        doc = json.load(fh)
    print("\n".join(lines(doc, a.tag, a.kernel) + top_lines(doc, a.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
