#!/usr/bin/env bash
# One device call (thirty-seventh session, issue 15): the block-major selection kernels with fewer instructions per
# logit. This tree: the mask is one compare (kpos <= t; rows past the count and keys past K's end need none), the
# forward's first sub-tile starts the softmax without rescaling an empty state, and its 1 / l and log2 come from the
# GPU's approximate units. $1 (.old/s37): the session's start. $2 (.old/s37v1): this tree without the approximate
# units. bench/profile_op.py at the 125M shape, 8k / B=4, two rounds while time lasts, then 64k / B=1 once each, then
# step_diff on the first round's pairs, then the GPU parity tests of the kernels the change reaches.
#   bash bench/calls/gpu_call37a.sh .old/s37 .old/s37v1
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s37}; v1=${2:-.old/s37v1}; budget=${BUDGET_S:-560}
ab_check_tree gpu_call37a "$base"; ab_check_tree gpu_call37a "$v1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
for r in 1 2; do
  [ "$r" = 2 ] && [ $((SECONDS - t0)) -gt 200 ] && break
  op . after$r 8192 4; op "$base" before$r 8192 4; op "$v1" v1_$r 8192 4
done
for pair in "before1 after1" "before1 v1_1"; do
  set -- $pair
  python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -14 | tee -a "$log"
done
if [ $((SECONDS - t0)) -lt 300 ]; then
  op . after64k 65536 1; op "$base" before64k 65536 1
fi
ab_gpu_tests "sel_fwd_block or sel_block_passes or 125m-8192 or packed_bf16 or bench-2048 or f32_matches"
exit $rc
