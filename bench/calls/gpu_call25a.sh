#!/usr/bin/env bash
# One device call (twenty-fifth session, issue 15): the window (and compressed) branch on the Pallas kernels instead
# of cuDNN, by KernelChoices.win_attn / cmp_attn. The op profiled (bench/profile_op.py, device busy per fwd+bwd),
# 125M, at 2k / B=16, 4k / B=8 and 8k / B=4 in four variants, 64k / B=1 in two; then the GPU parity of the Pallas
# window (bf16 vs the float32 reference, all outputs and gradients).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TMP=$(mktemp -d); LOG="$OUT/bench.log"
prof() {  # tag T B choices...
  local tag=$1 T=$2 B=$3; shift 3
  echo "== $tag (t=${SECONDS}s)" >> "$LOG"
  PYTHONPATH=. timeout 70 python3 bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 5 --top 60 \
    --choices "$@" --out "$TMP/op_$tag.json" >> "$LOG" 2>&1 || rc=1
}
for pt in 2048:16 8192:4 4096:8; do
  T=${pt%:*}; B=${pt#*:}; k=$((T / 1024))k
  prof "${k}_cudnn" "$T" "$B" win_attn=auto
  prof "${k}_win" "$T" "$B" win_attn=pallas
  prof "${k}_win_cmp" "$T" "$B" win_attn=pallas cmp_attn=pallas
  prof "${k}_cmp" "$T" "$B" cmp_attn=pallas
done
prof 64k_cudnn 65536 1 win_attn=auto
prof 64k_win 65536 1 win_attn=pallas
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_local_fwd nsa_local_bwd_dq nsa_local_bwd_dkv \
  nsa_cmp_fwd nsa_cmp_bwd_dq nsa_cmp_bwd_dkv_split | tee -a "$LOG"
echo "== tests (t=${SECONDS}s)" | tee -a "$LOG"
timeout $((590 - SECONDS)) python3 -m pytest -v -p no:cacheprovider tests/test_pallas_gpu.py \
  -k "pallas_window" 2>&1 | tail -8 | tee "$OUT/tests.log" || rc=1
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
