#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 fourth session): GPU parity of scoring/top-n and the
# selection op, scoring + top-n tile sweep (bench/score_topn.py) against the previous tree
# (.old/head, carried), and the 64k train step's compiled peak memory with branch outputs
# saved in bf16. Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
LOG="$OUT/call.log"; rc=0
PYTHONPATH=. timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE -s \
  -k "scores_and_selection or (bf16_matches and 8192) or sel_fwd_block or packed_bf16" \
  >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 8
PYTHONPATH=.old/head timeout 45 python3 bench/score_topn.py --T 8192 65536 \
  --out "$OUT/score_topn_before_h200.json" > "$OUT/before.txt" 2>> "$LOG" || rc=1
PYTHONPATH=. timeout 190 python3 bench/score_topn.py --T 8192 65536 --variants \
  "topn_warps=1 topn_elems=1024" "topn_warps=1 topn_elems=2048" "topn_warps=2 topn_elems=1024" \
  "topn_warps=2 topn_elems=2048" "topn_warps=8 topn_elems=8192" "score_warps=8" \
  "score_warps=2" "cmp_rows=64" "score_sel=32" \
  --out "$OUT/score_topn_h200.json" > "$OUT/after.txt" 2>> "$LOG" || rc=1
PYTHONPATH=. timeout 150 python3 bench/train_memory.py --points 65536:1 --variants "" \
  --out "$OUT/train_memory_64k_h200.json" >> "$LOG" 2>&1 || rc=1
echo "== before (HEAD tree)"; grep -v '^{' "$OUT/before.txt"
echo "== after"; grep -v '^{' "$OUT/after.txt"
grep compiled_peak "$LOG" | tail -n 3
exit $rc
