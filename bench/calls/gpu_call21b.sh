#!/usr/bin/env bash
# One device call (twenty-first session, issue 15): every gate-gradient sum behind its own barrier. The op
# profiled (bench/profile_op.py, device busy per fwd+bwd) for the tree before ($1) and this tree, alternating, at
# 125M 2k / B=16 and 8k / B=4 and the bench shape at 64k; this tree's 125M 64k compiled step peak; then GPU parity
# of the op (bf16 vs the float32 reference). Logs in one file (the device returns at most 8 files).
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for p in "125m 2048 16" "125m 8192 4" "bench 65536 1"; do set -- $p
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
    echo "== $tree $1 $2 $3" >> "$LOG"
    (cd "$dir" && PYTHONPATH=. timeout 110 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
      --top 40 --out "$TMP/op_${1}_$2_$tree.json") >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops21.json" --op input_concatenate_fusion | tee -a "$LOG"
PYTHONPATH=. timeout 120 python3 bench/train_memory.py --models nsa_125m --points 65536:1 \
  --out "$OUT/mem21.json" >> "$LOG" 2>&1 || rc=1
grep -iE "peak|GB" "$LOG" | tail -n 3
PYTHONPATH=. timeout 100 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bf16_matches_f32_reference and not sel_ and not packed" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
