#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 sixth session): where the 2k and 8k 125M train steps
# spend device time now (NSA and dense), and the NSA op alone at those shapes. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_prof}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/prof.log"; rc=0
timeout 330 python3 bench/profile_step.py --models nsa_125m dense_125m \
  --points 2048:16 8192:4 --steps 2 --top 45 --out "$OUT/profile_2k8k.json" >> "$LOG" 2>&1 || rc=1
for p in "2048 16" "8192 4"; do set -- $p
  timeout 90 python3 bench/profile_op.py --T $1 --B $2 --reps 3 --top 25 \
    --out "$OUT/profile_op_$1.json" >> "$LOG" 2>&1 || rc=1
done
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/profile_*.json")):
    d = json.load(open(f))
    for r in d.get("points", [d]):
        print(f.split("/")[-1], r.get("model"), r.get("seq_len", r.get("T")), r.get("batch", r.get("B")),
              "busy", r.get("device_busy_ms_per_step", r.get("device_ms")))
PY
tail -n 5 "$LOG"
exit $rc
