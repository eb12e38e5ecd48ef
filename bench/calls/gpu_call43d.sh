#!/usr/bin/env bash
# One device call (forty-third session, issue 15): where the bench op's blocking wall time goes beyond its device
# span (bench/op_latency.py at the bench shape, 64k, NSA fwd+bwd and cuDNN dense fwd+bwd), once with XLA's defaults
# and once with its command buffers off, one process each.
#   bash bench/calls/gpu_call43d.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; t0=$SECONDS
log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for mode in default cmdbuf_off; do
  flags=""; [ "$mode" = cmdbuf_off ] && flags="--xla_gpu_enable_command_buffer="
  echo "== $mode (XLA_FLAGS=$flags)" | tee -a "$log"
  XLA_FLAGS="$flags" timeout 240 python3 -W ignore::DeprecationWarning bench/op_latency.py --shape bench \
    --T 65536 --reps 10 --out "$OUT/latency_$mode.json" 2>&1 | grep -vE "^WARNING|^I0000|^E0000" | tail -16 \
    | tee -a "$log" || rc=1
  echo "  ($mode done at $((SECONDS - t0)) s)" | tee -a "$log"
done
exit $rc
