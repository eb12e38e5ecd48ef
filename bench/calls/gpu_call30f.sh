#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): the tiled selection kernels at sel_tile_warps = 4 for 128-wide heads.
# GPU parity (the bench-shape op and the tiled kernels), then the op at the bench shape, 2k / B=8 and 4k / B=4: the new
# default, the old launch (sel_tile_warps=8) and 128-query tiles at 8 warps.
#   bash bench/calls/gpu_call30f.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
timeout 260 python3 -m pytest -q -m gpu -W ignore::DeprecationWarning tests/test_pallas_tiled.py \
  "tests/test_pallas_gpu.py::test_bf16_matches_f32_reference" > "$OUT/tests.log" 2>&1 || rc=1
tail -1 "$OUT/tests.log" | tee -a "$log"; echo "tests: $((SECONDS - t0)) s" | tee -a "$log"
for pt in 2048:8 4096:4; do
  T=${pt%:*}; B=${pt#*:}
  for v in default sel_tile_warps=8 sel_tile_q=128,sel_tile_warps=8; do
    tiles=$([ $v = default ] && echo "" || echo "--tiles ${v//,/ }")
    PYTHONPATH=. timeout 120 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape bench --T "$T" \
      --B "$B" --reps 5 $tiles --top 6 --out "$OUT/op_${T}_${v//[=,]/_}.json" 2>&1 | grep -v "^WARNING" \
      | sed "s/^/$v /" | tee -a "$log" || rc=1
  done
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
