#!/usr/bin/env bash
# One device call (thirty-ninth session, issue 15): the selection gate folded into the saved lse (no gs in the gather
# backward kernels). This tree against $1 (.old/s39, the session's start), one process each: the 125M op at 8k / B=4
# (two rounds) and 64k / B=1, the bench-shape op at 64k (bench/ab_op.sh, one round), then the GPU tests of the
# selection backward kernels in bf16.
#   bash bench/calls/gpu_call39a.sh .old/s39
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s39}; budget=${BUDGET_S:-570}
ab_check_tree gpu_call39a "$base"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
for r in 1 2; do
  op . after8k$r 8192 4; op "$base" before8k$r 8192 4
  python3 bench/step_diff.py "$OUT/op_before8k$r.json" "$OUT/op_after8k$r.json" 2>&1 | head -10 | tee -a "$log"
done
op . after64k 65536 1; op "$base" before64k 65536 1
python3 bench/step_diff.py "$OUT/op_before64k.json" "$OUT/op_after64k.json" 2>&1 | head -10 | tee -a "$log"
mkdir -p "$OUT/bench_ab"; OUT="$OUT/bench_ab" bash bench/ab_op.sh "$base" bench:65536:1 ${BENCH_S:-145} 1 || rc=1
ab_gpu_tests "sel_fwd_block or sel_block_passes or sel_dq_with_query or (bf16_matches and 125m-8192) or packed_bf16"
exit $rc
