#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 sixth session): the compressed and window branch outputs
# kept in bf16. GPU parity of the default (cuDNN) paths, then the op's device time per layer
# (bench/profile_op.py) for the tree before (BEFORE=DIR, carried) and this one, and the 64k step's
# compiled peak. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_bf16}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
LOG="$OUT/bf16.log"; rc=0
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE \
  -k "cmp_attn_cudnn or (bf16_matches and 125m) or packed_bf16" >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 6
for p in "2048 16" "8192 4" "65536 1"; do set -- $p
  for tree in ${BEFORE:-} .; do tag=$([ "$tree" = . ] && echo after || echo before)
    PYTHONPATH=$tree timeout 100 python3 $tree/bench/profile_op.py --T $1 --B $2 --reps 5 --top 12 \
      --out "$OUT/op_${1}_${tag}.json" > "$OUT/op_${1}_${tag}.log" 2>&1 || rc=1
    echo "$tag $(head -n 1 "$OUT/op_${1}_${tag}.log")"
  done
done
PYTHONPATH=. timeout 150 python3 bench/train_memory.py --points 65536:1 \
  --out "$OUT/train_memory_64k.json" >> "$LOG" 2>&1 || rc=1
tail -n 3 "$LOG"
exit $rc
