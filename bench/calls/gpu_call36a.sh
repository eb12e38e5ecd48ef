#!/usr/bin/env bash
# One device call (thirty-sixth session, issue 15): the block-major selection kernels with their loads one tile ahead.
# Three trees in one call, one process each: this one (forward: q rows one tile ahead, index entries two; backward:
# index entries one tile ahead), $1 (the session's start, .old/s36) and $2 (.old/s36v2: the backward's q, dO and row
# scalars one tile ahead too). bench/profile_op.py at the 125M shape, 8k / B=4, two rounds while time lasts, then 64k / B=1
# once each, then step_diff on the first round's pairs, then the GPU parity tests that run the block-major kernels.
#   bash bench/calls/gpu_call36a.sh .old/s36 .old/s36v2
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s36}; v2=${2:-.old/s36v2}; budget=560
ab_check_tree gpu_call36a "$base"; ab_check_tree gpu_call36a "$v2"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
for r in 1 2; do
  [ "$r" = 2 ] && [ $((SECONDS - t0)) -gt 200 ] && break
  op . after$r 8192 4; op "$base" before$r 8192 4; op "$v2" v2_$r 8192 4
done
for pair in "before1 after1" "before1 v2_1"; do
  set -- $pair
  python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -14 | tee -a "$log"
done
if [ $((SECONDS - t0)) -lt 300 ]; then
  op . after64k 65536 1; op "$base" before64k 65536 1; op "$v2" v2_64k 65536 1
fi
ab_gpu_tests "sel_fwd_block or sel_block_passes or 125m-8192 or cmp_attn_cudnn or packed_bf16"
exit $rc
