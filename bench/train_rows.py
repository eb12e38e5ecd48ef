"""Print one line per (model, point) of ``bench/train_throughput.py`` JSON files: the table the
device-call scripts end with.

    python3 bench/train_rows.py OUT/train_*.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths) -> None:
    for p in paths:
        for r in json.loads(Path(p).read_text())["points"]:
            print("%-34s %10s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (
                Path(p).name[:34], r["model"], r["seq_len"], r["batch"], r["step_ms"],
                r["tokens_per_s"], r.get("compiled_peak_gb") or 0))


if __name__ == "__main__":
    main(sys.argv[1:])
