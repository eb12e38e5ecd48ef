#!/usr/bin/env bash
# One device call (issue 15, tenth session): GPU parity of the scoring layouts, scoring + top-n
# timed per layout and tile (bench/score_topn.py, 125M and bench shapes), and NSA training at one
# point with exec.kernel.score_heads rows vs auto (loop at the 125M shape) in the same tree, one
# process per run. Logs and JSON under $OUT.
# Usage: bash bench/calls/gpu_scoring10.sh [pytest -k expression] [T:B] [per-run train timeout s]
#   call 2: -k "scores_and_selection or (bf16_matches and 125m and 8192)", 65536:1, 140
#   call 3: -k "packed_bf16 or whatever_the_global_precision or (no_nan and auto) or
#           (bf16_matches and 125m and 2048)", 8192:4, 100 (both 8k runs timed out: give 8k ~170 s)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
TESTS=${1:-"scores_and_selection or (bf16_matches and 125m and 8192)"}
POINT=${2:-65536:1}; LIMIT=${3:-170}; LOG="$OUT/call.log"; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE -k "$TESTS" \
  >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 6
timeout 170 python3 bench/score_topn.py --shape 125m --T 8192 65536 --variants \
  "score_heads=rows" "score_heads=loop score_q=16" "score_heads=loop score_q=64" \
  "score_heads=loop score_warps=8" "score_heads=loop score_sel=32" \
  "score_heads=loop score_q=64 score_warps=8" \
  --out "$OUT/score_topn_125m.json" > "$OUT/score_125m.txt" 2>> "$LOG" || rc=1
timeout 60 python3 bench/score_topn.py --shape bench --T 65536 --variants \
  "score_heads=loop score_q=16" --out "$OUT/score_topn_bench.json" > "$OUT/score_bench.txt" \
  2>> "$LOG" || rc=1
for v in rows auto; do
  timeout "$LIMIT" python3 bench/train_throughput.py --no-loader --models nsa_125m \
    --points "$POINT" --steps 8 --override exec.kernel.score_heads=$v \
    --out "$OUT/train_$(echo "$POINT" | tr : x)_$v.json" >> "$OUT/train.log" 2>&1 || rc=1
done
echo "== scoring 125m"; grep -v '^{' "$OUT/score_125m.txt"
echo "== scoring bench"; grep -v '^{' "$OUT/score_bench.txt"
echo "== train $POINT (rows, auto)"; grep -E '^\{' "$OUT/train.log" | python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    print("%10s T=%6d %8.1f ms %10.0f tok/s peak %.3f GB" % (r["model"], r["seq_len"],
          r["step_ms"], r["tokens_per_s"], r.get("compiled_peak_gb") or 0))'
exit $rc
