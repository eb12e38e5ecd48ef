#!/usr/bin/env bash
# One device call (twentieth session, issue 14): the one-launch phi emission where rows emit often: rows at
# staggered positions (bench/decode.py --ragged: row b at N-1 - b % d), 64k / B=8 (half the steps emit) and
# 64k / B=64 (every row tile emits every step), NSA, the tree before ($1) and this tree, one process each.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
LOG="$OUT/bench.log"
for pt in "65536 8" "65536 64"; do set -- $pt
  ARGS="--models nsa_125m --contexts $1 --batches $2 --reps 30 --ragged --profile $1:$2"
  for tree in old new; do
    echo "== $tree $1 $2" >> "$LOG"
    D=.; [[ $tree == old ]] && D=$OLD
    (cd "$D" && PYTHONPATH=. timeout 150 python3 bench/decode.py $ARGS --out "$OUT/${tree}_$1_$2.json" \
      >> "$LOG" 2>&1) || rc=1
  done
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
for pt in ("65536_8", "65536_64"):
  for tree in ("old", "new"):
    f = f"{out}/{tree}_{pt}.json"
    if not os.path.exists(f): print(pt, tree, "missing"); continue
    for p in json.load(open(f))["points"]:
      lp = p.get("loop_profile") or {}
      ks = "  ".join(f"{o['name'].replace('nsa_decode_', '')} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):.1f}"
                     for o in lp.get("top_ops", []) if o["name"].startswith("nsa_decode_phi"))
      print(f"{pt:>9} {tree:>4} loop {p.get('loop_ms', 0):.3f} busy {lp.get('device_busy_ms_per_step', 0):.3f} "
            f"kernels {lp.get('n_kernels_per_step', 0):.1f}  {ks}")
PY
grep -E "failed|Error" "$LOG" | head -5
exit $rc
