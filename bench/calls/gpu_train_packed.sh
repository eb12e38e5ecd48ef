#!/usr/bin/env bash
# One device call (issue 16, eighth session): 125M training throughput with and without document
# packing (bench/train_throughput.py --packing concat documents: the bundled sample's token
# shards; concat = documents joined, documents = segment ids), nsa_125m at 8k B=4 and 64k B=1.
# JSON under $OUT (rewritten after every point); short table last.
set -u
OUT=${OUT:-/tmp/nsa_trainpacked}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
J="$OUT/train_packed_h200_2026-11-24.json"
timeout 560 python3 bench/train_throughput.py --models nsa_125m --points 8192:4 65536:1 \
  --steps 10 --packing concat documents --out "$J" > "$OUT/train_packed.log" 2>&1; rc=$?
python3 - "$J" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d.get("points", d) if isinstance(d, dict) else d
for r in rows:
    if isinstance(r, dict):
        print(r.get("model"), r.get("packing"), r.get("seq_len"), r.get("batch"),
              round(r.get("tokens_per_s")), round(r.get("step_ms"), 1), round(r.get("compiled_peak_gb"), 3))
PY
exit $rc
