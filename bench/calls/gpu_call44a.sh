#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the decode step's dense layers as Pallas kernels
# (pallas.decode_layers, exec.decode_layers). First the GPU tests (the kernels against XLA in bf16; the decode
# paths, which now take them), then the layers alone per tile variant (bench/decode_layers.py), then both models
# at 64k / B=8 with the layers in Pallas (the default, profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44a.sh
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TESTS_S:-240}" python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning \
  tests/test_decode_layers.py tests/test_decode.py tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -8 | tee -a "$log"
echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
PYTHONPATH=. timeout 200 python3 -W ignore::DeprecationWarning bench/decode_layers.py --batches 8 64 1 \
  --variants xla default cols=16 cols=64 k_step=64 k_step=256 stages=2 stages=4 warps=2 warps=8 \
  --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1 || rc=1
sed -E 's/(us per layer).*/\1/' "$OUT/layers.log" | grep "^B=" | tee -a "$log"
echo "  (layers done at $((SECONDS - t0)) s)" | tee -a "$log"
for tag in pallas xla; do
  prof=(); [ "$tag" = pallas ] && prof=(--profile 65536:8)
  PYTHONPATH=. timeout 170 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 8 \
    --reps 30 --set exec.decode_layers=$tag "${prof[@]}" --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1 || rc=1
  grep -E "^(nsa|dense)_125m" "$OUT/decode_$tag.log" | sed "s/^/$tag  /" | tee -a "$log"
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
[ -f "$OUT/decode_pallas.json" ] && python3 bench/decode_summary.py "$OUT/decode_pallas.json" pallas --top 14 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
