#!/usr/bin/env bash
# One device call (sixteenth session, call 2): the 125M NSA train step at 8k / B=4 and 2k / B=16 with
# KernelChoices.streams "off" and "all" (each point and mode its own process; bench/train_throughput.py).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for p in 8192:4 2048:16; do
  for m in ${MODES:-off all all off}; do
    timeout 150 python3 bench/train_throughput.py --no-loader --models nsa_125m --points "$p" \
      --steps 8 $([ $m = off ] || echo --override exec.kernel.streams=$m) --out "$OUT/train_${p/:/x}_$m.json" \
      >> "$OUT/train.log" 2>&1 || rc=1
    grep -E "^\{" "$OUT/train.log" | tail -1 | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("%s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (sys.argv[1], r["seq_len"], r["batch"],
      r["step_ms"], r["tokens_per_s"], r.get("compiled_peak_gb") or 0))' "$m"
  done
done
exit $rc
