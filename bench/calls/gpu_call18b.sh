#!/usr/bin/env bash
# One device call (eighteenth session): sel_dq "ds" (dS in entry order) with tile variants of its dK/dV kernel
# (num_stages) and its dQ-from-dS kernel (sel_stages, sel_warps) against "query", bench shape, 64k, one
# process; then the peers table on the same GPU (carry .whl and .peers/xunhao; bench/peers_run.sh).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=.:bench timeout 240 python3 bench/sel_dq_ab.py --shape bench --T 65536 --rounds 2 --modes query ds \
  ds:num_stages=3 ds:sel_stages=2 ds:sel_stages=4 ds:sel_warps=2 --out "$OUT/ab.json" \
  > "$OUT/ab.log" 2>&1 || rc=1
grep -E "rrmse|sel_bwd|Error" "$OUT/ab.log"
source bench/peers_run.sh
exit $rc
