"""Join ``bench/profile_op.py`` JSONs into one file and print their device-busy table.

    python bench/op_table.py DIR OUT.json [--op NAME ...]

DIR holds ``op_<tag>.json`` files (one per profiled call); OUT.json maps each tag to its profile.
Each row prints the device-busy ms per fwd+bwd call, the selection kernels' share (ops named
``*sel*``) and the ms of every ``--op`` (0 when absent). The GPU scripts (bench/gpu_*.sh) call it
last, so the table ends their output.
"""
from __future__ import annotations

import argparse
import glob
import json
import os


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--op", nargs="*", default=[], help="op names to show per row")
    a = ap.parse_args(argv)
    ops = {os.path.basename(f)[3:-5]: json.load(open(f))
           for f in sorted(glob.glob(os.path.join(a.dir, "op_*.json")))}
    with open(a.out, "w") as f:
        json.dump(ops, f, indent=1)
    print("device busy ms per fwd+bwd call:")
    for tag, r in ops.items():
        top = {o["name"]: o["ms_per_step"] for o in r["top_ops"]}
        sel = sum(ms for name, ms in top.items() if "sel" in name)
        extra = "".join(f"  {n} {top.get(n, 0.0):.3f}" for n in a.op)
        docs = f"  docs {r['docs']}" if r.get("docs") else ""
        print(f"  {tag:28s} busy {r['device_busy_ms_per_step']:7.3f}  selection {sel:6.3f}"
              f"{extra}{docs}")


if __name__ == "__main__":
    main()
