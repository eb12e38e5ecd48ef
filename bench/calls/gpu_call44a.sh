#!/usr/bin/env bash
# One device call (forty-fourth session, issue 14): the decode step's dense layers as Pallas kernels
# (pallas.decode_layers, exec.decode_layers). First the GPU tests (the kernels against XLA in bf16; the decode
# paths, which now take them), then the layers alone per tile variant (bench/decode_layers.py), then both models
# at 64k / B=8 with the layers in Pallas (the default, profiled) and in XLA, one process each.
#   bash bench/calls/gpu_call44a.sh
# (Its steps moved into bench/calls/decode_layers_ab.sh after the session's calls: the same commands; the printed
# summary differs a little: the sweep's default and xla lines at B = 8, and a line when the tests end.)
# (Runs from a tree with bench/wip/decode-layers.patch applied (branch wip/decode-layers): the kernels, their tests
# and bench/decode_layers.py were not taken onto main.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
source bench/calls/decode_layers_ab.sh
layers_tests 240 tests/test_decode_layers.py tests/test_decode.py tests/test_decode_dense.py
layers_sweep 200 "8 64 1" xla default cols=16 cols=64 k_step=64 k_step=256 stages=2 stages=4 warps=2 warps=8
layers_ab 170 14
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
