#!/usr/bin/env bash
# One device call (seventeenth session): the scoring kernel's head sum as a dot ("dot": 3 bf16 terms, "dot2": 2)
# (The "dot" layouts exist only in commit 568d4be, reverted after this call: run it there.)
# against the rows and loop layouts, kernel alone (`bench/score_topn.py`: scores and ids against the default's,
# then times), bench shape at 64k, 125M shape at 8k and 64k.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 bench/score_topn.py --shape bench --T 65536 --reps 20 \
  --variants "score_heads=dot" "score_heads=dot2" "score_heads=rows" "score_heads=dot" \
  --out "$OUT/score_bench.json" > "$OUT/score_bench.log" 2>&1 || rc=1
timeout 200 python3 bench/score_topn.py --shape 125m --T 8192 65536 --reps 20 \
  --variants "score_heads=rows" "score_heads=dot" "score_heads=dot2" "score_heads=loop" \
  --out "$OUT/score_125m.json" > "$OUT/score_125m.log" 2>&1 || rc=1
grep -E "^ *[0-9]+ |Error" "$OUT"/score_*.log
exit $rc
