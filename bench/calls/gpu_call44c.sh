#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the decode-layer kernels with the K loop unrolled and every
# load issued first (the default now), against the pipelined loop and XLA: the GPU tests, the tile sweep at B = 8
# and 64 (a variant that does not fit is recorded as failed), then both models at 64k / B=8 with the layers in
# Pallas (profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44c.sh
# (Its steps moved into bench/calls/decode_layers_ab.sh after the session's calls: the same commands; the printed
# summary differs a little: the sweep's default and xla lines at B = 8, and a line when the tests end.)
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
source bench/calls/decode_layers_ab.sh
layers_tests 120 tests/test_decode_layers.py
layers_sweep 200 "8 64" xla default cols=16,k_step=128 cols=32,k_step=256 cols=16,k_step=512 \
  cols=64,k_step=256 warps=2 warps=8 unroll=0,k_step=256,stages=4 unroll=0,cols=32,k_step=256,stages=4
layers_ab 150 8
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
