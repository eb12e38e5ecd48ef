#!/usr/bin/env bash
# One device call (eleventh session): 125M training at 8k and 2k, NSA and dense in one process per
# point (bench/gpu_train_refresh.sh), then a profile of the NSA 64k train step
# (bench/profile_step.py, top ops and kernels) to name what is left. JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
OUT=$OUT bash bench/gpu_train_refresh.sh "${1:-8192:4 2048:16}" "${2:-180}" || rc=1
timeout 200 python3 bench/profile_step.py --models nsa_125m --points 65536:1 --steps 2 --top 45 \
  --out "$OUT/profile_nsa_64k.json" > "$OUT/profile.log" 2>&1 || rc=1
grep -A 40 "^== nsa_125m" "$OUT/profile.log" | cut -c1-150 || tail -n 5 "$OUT/profile.log"
exit $rc
