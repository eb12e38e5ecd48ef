#!/usr/bin/env bash
# One device call (twentieth session, issue 14): GPU decode tests; the decode step with phi's output layer in
# its hidden-layer kernel's completing programs (one launch; the finishing-merge fold of call 2 reverted) against
# the tree before ($1), one process each, per token in the 16-token loop, each point profiled: 64k / B=8 (and
# dense there), 64k / B=1, 32k / B=64. Logs in one file (the device returns at most 8 files).
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 240 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_pallas_decode_select.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
LOG="$OUT/bench.log"
for pt in "65536 8" "65536 1" "32768 64"; do set -- $pt
  M="--models nsa_125m"; [[ $2 == 8 ]] && M=""
  ARGS="--contexts $1 --batches $2 --reps 30 --profile $1:$2"
  echo "== old $1 $2" >> "$LOG"
  (cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py --models nsa_125m $ARGS \
    --out "$OUT/old_$1_$2.json" >> "$LOG" 2>&1) || rc=1
  echo "== new $1 $2" >> "$LOG"
  PYTHONPATH=. timeout 200 python3 bench/decode.py $M $ARGS --out "$OUT/new_$1_$2.json" >> "$LOG" 2>&1 || rc=1
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print(f"{'point':>10} {'tree':>4} {'model':>10} {'loop ms':>8} {'busy ms':>8} {'kernels':>8}  attention kernels us/layer")
for pt in ("65536_8", "65536_1", "32768_64"):
  for tree in ("old", "new"):
    f = f"{out}/{tree}_{pt}.json"
    if not os.path.exists(f): print(pt, tree, "missing"); continue
    for p in json.load(open(f))["points"]:
      lp = p.get("loop_profile") or {}
      ks = "  ".join(f"{o['name'].replace('nsa_decode_', '')} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):.1f}"
                     for o in lp.get("top_ops", []) if o["name"].startswith("nsa_decode_"))
      print(f"{pt:>10} {tree:>4} {p['model']:>10} {p.get('loop_ms', 0):8.3f} {lp.get('device_busy_ms_per_step', 0):8.3f} "
            f"{lp.get('n_kernels_per_step', 0):8.1f}  {ks}")
PY
grep -E "failed|Error" "$LOG" | head -5
exit $rc
