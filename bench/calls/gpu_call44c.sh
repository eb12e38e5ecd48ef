#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the decode-layer kernels with the K loop unrolled and every
# load issued first (the default now), against the pipelined loop and XLA: the GPU tests, the tile sweep at B = 8
# and 64 (a variant that does not fit is recorded as failed), then both models at 64k / B=8 with the layers in
# Pallas (profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44c.sh
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 120 python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning \
  tests/test_decode_layers.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -4 | tee -a "$log"
PYTHONPATH=. timeout 200 python3 -W ignore::DeprecationWarning bench/decode_layers.py --batches 8 64 \
  --variants xla default cols=16,k_step=128 cols=32,k_step=256 cols=16,k_step=512 cols=64,k_step=256 \
  warps=2 warps=8 unroll=0,k_step=256,stages=4 unroll=0,cols=32,k_step=256,stages=4 \
  --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1 || rc=1
sed -E 's/(us per layer).*/\1/' "$OUT/layers.log" | grep "^B=" | tee -a "$log"
grep -E "^B=  8 (default|xla)" "$OUT/layers.log" | cut -c1-260 | tee -a "$log"
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
