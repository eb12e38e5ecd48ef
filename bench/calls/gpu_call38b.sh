#!/usr/bin/env bash
# One device call (thirty-eighth session, issue 15): the scoring kernel's rows layout transposed (s^T = K Q^T). This
# tree against $1 (.old/s38v1, call 1's tree), one process each: the bench-shape op at 64k (bench/ab_op.sh, two
# rounds), then the GPU tests of the scoring kernel (float32 scores against the reference, both layouts) and of the
# bf16 op at the bench shape.
#   bash bench/calls/gpu_call38b.sh .old/s38v1
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s38v1}; budget=${BUDGET_S:-480}
ab_check_tree gpu_call38b "$base"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
mkdir -p "$OUT/bench_ab"; OUT="$OUT/bench_ab" bash bench/ab_op.sh "$base" bench:65536:1 280 2 || rc=1
ab_gpu_tests "scores_and_selection or (bf16_matches_f32_reference and bench-2048)"
exit $rc
