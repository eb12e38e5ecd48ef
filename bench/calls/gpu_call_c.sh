#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 third session): compiled peak memory of the 64k 125M NSA
# train step per selection-kernel choice (bench/train_memory.py), and the 8k / 2k training
# points (both models, same call) that call B's time limit cut. Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call_c}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/call_c.log"; rc=0
timeout 220 python3 bench/train_memory.py --points 65536:1 --variants "" \
  "exec.kernel.sel_dq=query" "exec.kernel.sel_fwd=query exec.kernel.sel_dq=query" \
  --out "$OUT/train_memory_64k_h200.json" >> "$LOG" 2>&1 || rc=1
timeout 300 python3 bench/train_throughput.py --no-loader --points 8192:4 2048:16 --steps 8 \
  --out "$OUT/train_throughput_h200x1.json" >> "$LOG" 2>&1 || rc=1
grep '"compiled_peak_gb"' "$LOG" | grep overrides
sed -n '/^model/,$p' "$LOG" | tail -n 6
exit $rc
