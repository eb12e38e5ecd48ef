#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): call 1 again after the decode-layer kernels' loads became
# contiguous slices (pl.ds) and bench/decode_layers.py gave each of its 12 layers its own weights (past the L2):
# the GPU tests of the kernels, the tile sweep at B = 8 and 64, then both models at 64k / B=8 with the layers in
# Pallas (profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44b.sh
# (Its steps moved into bench/calls/decode_layers_ab.sh after the session's calls: the same commands; the printed
# summary differs a little: the sweep's default and xla lines at B = 8, and a line when the tests end.)
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
source bench/calls/decode_layers_ab.sh
layers_tests 120 tests/test_decode_layers.py
layers_sweep 240 "8 64" xla default k_step=256 k_step=512 cols=16,k_step=256 cols=16,k_step=512 \
  cols=16,k_step=1024 cols=64,k_step=256 k_step=256,stages=4 k_step=256,warps=2 k_step=256,warps=8
layers_ab 150 8
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
