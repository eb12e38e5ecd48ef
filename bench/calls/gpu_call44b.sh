#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): call 1 again after the decode-layer kernels' loads became
# contiguous slices (pl.ds) and bench/decode_layers.py gave each of its 12 layers its own weights (past the L2):
# the GPU tests of the kernels, the tile sweep at B = 8 and 64, then both models at 64k / B=8 with the layers in
# Pallas (profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44b.sh
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 120 python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning \
  tests/test_decode_layers.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -4 | tee -a "$log"
PYTHONPATH=. timeout 240 python3 -W ignore::DeprecationWarning bench/decode_layers.py --batches 8 64 \
  --variants xla default k_step=256 k_step=512 cols=16,k_step=256 cols=16,k_step=512 cols=16,k_step=1024 \
  cols=64,k_step=256 k_step=256,stages=4 k_step=256,warps=2 k_step=256,warps=8 \
  --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1 || rc=1
sed -E 's/(us per layer).*/\1/' "$OUT/layers.log" | grep "^B=" | tee -a "$log"
grep "^B=  8 default" "$OUT/layers.log" | tee -a "$log"
echo "  (layers done at $((SECONDS - t0)) s)" | tee -a "$log"
for tag in pallas xla; do
  prof=(); [ "$tag" = pallas ] && prof=(--profile 65536:8)
  PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 8 \
    --reps 30 --set exec.decode_layers=$tag "${prof[@]}" --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1 || rc=1
  grep -E "^(nsa|dense)_125m" "$OUT/decode_$tag.log" | sed "s/^/$tag  /" | tee -a "$log"
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
[ -f "$OUT/decode_pallas.json" ] && python3 bench/decode_summary.py "$OUT/decode_pallas.json" pallas --top 8 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
