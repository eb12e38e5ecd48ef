#!/usr/bin/env bash
# One device call (twenty-first session, issue 15): what call 2 (gpu_call21b.sh) ran out of time for. The 125M
# 64k train step's compiled peak for this tree and the tree before ($1), compile only, then GPU parity of the op
# (bf16 vs the float32 reference) on this tree. Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); LOG="$OUT/bench.log"
for tree in after before; do
  dir=$HERE; [[ $tree == before ]] && dir=$HERE/$1
  echo "== $tree" >> "$LOG"
  (cd "$dir" && PYTHONPATH=. timeout 190 python3 bench/train_memory.py --models nsa_125m --points 65536:1 \
    --out "$OUT/mem_$tree.json") >> "$LOG" 2>&1 || rc=1
done
grep -vE "^\s*$" "$LOG" | grep -iE "==|peak|GB" | head -n 8
PYTHONPATH=. timeout 170 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "bf16_matches_f32_reference and not sel_ and not packed" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
