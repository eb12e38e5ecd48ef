#!/usr/bin/env bash
# One device call (thirty-sixth session, issue 15): the block-major kernels' causal split (an item's tiles whose rows
# all see the whole block drop the mask). Three trees in one call, one process each: this one (forward and backward
# split), $1 (.old/s36b: the tree before) and $2 (.old/s36c: the forward's split only). bench/profile_op.py at the
# 125M shape, 8k / B=4, two rounds, then 64k / B=1 once each while the budget lasts, then the GPU parity tests of the
# block-major kernels with the time left.
#   bash bench/calls/gpu_call36d.sh .old/s36b .old/s36c
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s36b}; fwd=${2:-.old/s36c}; budget=${BUDGET_S:-280}
ab_check_tree gpu_call36d "$base"; ab_check_tree gpu_call36d "$fwd"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 12 --out "$OUT/op_$2.json"
}
for r in 1 2; do op . after$r 8192 4; op "$base" before$r 8192 4; op "$fwd" fwd$r 8192 4; done
python3 bench/step_diff.py "$OUT/op_before1.json" "$OUT/op_after1.json" 2>&1 | head -14 | tee -a "$log"
if [ $((SECONDS - t0)) -lt 100 ]; then op . after64k 65536 1; op "$base" before64k 65536 1; fi
ab_gpu_tests "sel_fwd_block or sel_block_passes or 125m-8192"
exit $rc
