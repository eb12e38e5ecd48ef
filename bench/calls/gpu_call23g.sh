#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): the block-major selection forward at 64 (query, head) rows per
# tile instead of 128 (BlockSizes.sel_rows; register-bound at 207 registers, 2 CTAs per SM under ncu). The op
# profiled (bench/profile_op.py, device busy per fwd+bwd) with the defaults and sel_rows=64 at 125M 8k / B=4
# (two rounds) and 64k / B=1 (one). Logs in one file.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TMP=$(mktemp -d); LOG="$OUT/bench.log"
for p in "8192 4 1" "65536 1 1" "8192 4 2"; do set -- $p
  for v in default sel_rows=64; do
    tiles=""; [[ $v != default ]] && tiles="--tiles $v"
    echo "== $v $1 $2 round $3 (t=${SECONDS}s)" >> "$LOG"
    PYTHONPATH=. timeout 100 python3 bench/profile_op.py --shape 125m --T $1 --B $2 --reps 5 $tiles \
      --top 40 --out "$TMP/op_125m_$1_${v/=/}_r$3.json" >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_fwd_block nsa_sel_bwd_block | tee -a "$LOG"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
