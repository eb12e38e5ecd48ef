#!/usr/bin/env bash
# One device call (forty-sixth session): the GPU tests calls 1 and 2 did not finish, on the tree of fba3d24 (the
# forty-fifth session's end: its Mosaic GPU split and the attention modules' _StepWeights mixin, never run on a GPU).
# Verbose, so a cap still shows what ran; everything in one log.
#   bash bench/calls/gpu_call46c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${MOSAIC_S:-300}" python3 -m pytest -m gpu -p no:cacheprovider -v -W ignore::DeprecationWarning -rfE \
  --durations=0 tests/test_mosaic_window.py \
  "tests/test_mosaic_tiled.py::test_gpu_mosaic_dkv_matches_reference_and_triton[256-2-1-64]" \
  tests/test_mosaic_tiled.py::test_gpu_full_nsa_with_mosaic_forward_bf16 >> "$log" 2>&1 || rc=1
echo "  (Mosaic GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${DECODE_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -W ignore::DeprecationWarning -rfE \
  --durations=0 tests/test_decode.py tests/test_decode_dense.py >> "$log" 2>&1 || rc=1
echo "  (decode GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
grep -E "PASSED|FAILED|ERROR|passed|failed" "$log" | tail -30
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
