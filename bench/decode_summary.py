"""One line per point of a ``bench/decode.py`` JSON: the loop and synced-step ms per token, the
traced loop's busy and span (with ``--profile``), and one kernel's device us per token.

    python bench/decode_summary.py decode.json TAG [--kernel nsa_cache_write]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("tag")
    p.add_argument("--kernel", default="nsa_cache_write")
    a = p.parse_args(argv)
    with open(a.json) as fh:
        print("\n".join(lines(json.load(fh), a.tag, a.kernel)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
