"""Join bench/decode.py JSON files of one device run split over several calls (each call's
contexts) into one file, with the dense / NSA ratios recomputed over all points.

    python bench/decode_merge.py OUT.json A.json B.json ...

The files must come from the same device and jax version (checked); points of a later file
replace those of an earlier one at the same (model, context, batch).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import print_speedups, speedups  # noqa: E402


def merge(docs: list[dict]) -> dict:
    out = {k: v for k, v in docs[0].items() if k not in ("points", "speedup_nsa_vs_dense")}
    pts = {}
    for d in docs:
        for k in ("device", "jax"):
            if d[k] != out[k]:
                raise SystemExit(f"decode_merge: {k} differs between files: {out[k]!r} vs {d[k]!r}")
        for p in d["points"]:
            pts[(p["model"], p["context"], p["batch"])] = p
    out["points"] = [pts[k] for k in sorted(pts)]
    out["speedup_nsa_vs_dense"] = speedups(out["points"])
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        raise SystemExit(__doc__)
    out = merge([json.loads(Path(f).read_text()) for f in argv[1:]])
    out["merged_from"] = [Path(f).name for f in argv[1:]]
    Path(argv[0]).write_text(json.dumps(out, indent=1))
    print_speedups(out)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
