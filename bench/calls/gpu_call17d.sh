#!/usr/bin/env bash
# One device call (seventeenth session): the scoring kernel's tile at the bench shape, 64k
# (`bench/score_topn.py` variants: warps, rows per program, keys per step, pipeline stages).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 300 python3 bench/score_topn.py --shape bench --T 65536 --reps 20 --variants \
  "score_warps=8" "score_warps=2" "cmp_rows=256 score_warps=8" "cmp_rows=256 score_warps=4" "cmp_rows=64" \
  "num_stages=3" "score_sel=32" "score_sel=32 score_warps=8" "score_warps=4" \
  --out "$OUT/score_sweep.json" > "$OUT/score_sweep.log" 2>&1 || rc=1
grep -E "^ *[0-9]+ |Error" "$OUT/score_sweep.log"
exit $rc
