"""Short table of ``bench/decode.py`` JSON files side by side (e.g. a tree before and after a
change, run in the same device call):

    python bench/decode_compare.py before.json after.json [--top 8]

Per point: synced step, streamed step and per-token loop time (ms), and with ``--profile``
points the kernels per step, the device-busy time per step and the costliest kernels."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    print(f"{'file':28s} {'model':10s} {'N':>7s} {'B':>3s} {'step':>7s} {'stream':>7s} "
          f"{'loop':>7s} {'kernels':>7s} {'busy':>6s}")
    tops = []
    for f in a.files:
        for p in json.loads(Path(f).read_text())["points"]:
            if "step_ms" not in p:
                continue
            pr = p.get("profile") or {}
            print(f"{Path(f).stem[:28]:28s} {p['model']:10s} {p['context']:7d} {p['batch']:3d} "
                  f"{p['step_ms']:7.3f} {p['stream_ms']:7.3f} {p.get('loop_ms', float('nan')):7.3f} "
                  f"{pr.get('n_kernels_per_step', 0):7.0f} "
                  f"{pr.get('device_busy_ms_per_step', 0):6.3f}")
            if pr:
                tops.append((Path(f).stem, p, pr))
    for stem, p, pr in tops:
        print(f"\n{stem} {p['model']} N={p['context']} B={p['batch']}: top kernels "
              "(ms per step, calls per step)")
        for k in pr["top_kernels"][:a.top]:
            print(f"  {k['name'][:44]:44s} {k['ms_per_step']:7.4f} {k['calls_per_step']:5.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
