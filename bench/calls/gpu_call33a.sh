#!/usr/bin/env bash
# One device call (thirty-third session): the Mosaic GPU kernels' GPU tests after the thirty-second session's last
# changes, which no GPU has run (the tests' shared helpers and backward set-up, the skip rule, the step-width check,
# the list-operand launcher, the window lists' padding width at w > T and broadcast constant).
#   bash bench/calls/gpu_call33a.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
python3 -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)" | tee -a "$log"
timeout 500 python3 -m pytest -q -m gpu tests/test_mosaic_tiled.py tests/test_mosaic_window.py -s -p no:cacheprovider \
  -W ignore::DeprecationWarning 2>&1 | tee "$OUT/tests.log" \
  | grep -E "^[.Fs]*[0-9]+ |rrmse|passed|failed|Error|error" | tail -40 | tee -a "$log" || rc=1
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
