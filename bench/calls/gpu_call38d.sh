#!/usr/bin/env bash
# One short device call (thirty-eighth session, issue 15): the transposed scoring step carrying its spill as a rotated
# tile (no cross-warp reduction for the carry). This tree against $1 (.old/s38v2, call 3's tree): the bench-shape op
# at 64k, one round (bench/ab_op.sh), then the float32 scoring test at the bench heads.
#   bash bench/calls/gpu_call38d.sh .old/s38v2
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s38v2}; budget=${BUDGET_S:-215}
ab_check_tree gpu_call38d "$base"
mkdir -p "$OUT/bench_ab"; OUT="$OUT/bench_ab" bash bench/ab_op.sh "$base" bench:65536:1 150 1 || rc=1
ab_gpu_tests "scores_and_selection and bench"
exit $rc
