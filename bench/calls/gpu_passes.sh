#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 fourth session): GPU parity of the block-major kernels
# in slot passes, the 64k train step's compiled peak by KernelChoices.sel_partial_mib, and the
# 64k op's kernel profile with the default passes. Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
LOG="$OUT/call.log"; rc=0
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE -s \
  -k "sel_block_passes or (bf16_matches and 125m and 8192)" >> "$LOG" 2>&1 || rc=1
timeout 75 python3 bench/profile_op.py --T 65536 --top 16 \
  --out "$OUT/profile_op_64k_h200.json" > "$OUT/profile_op.txt" 2>> "$LOG" || rc=1
timeout 300 python3 bench/train_memory.py --points 65536:1 --variants "" \
  "exec.kernel.sel_partial_mib=1024" --out "$OUT/train_memory_64k_h200.json" >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed|^125m" "$LOG" | tail -n 8
cat "$OUT/profile_op.txt"
grep compiled_peak "$LOG" | tail -n 3
exit $rc
