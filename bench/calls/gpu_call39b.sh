#!/usr/bin/env bash
# One device call (thirty-ninth session, issue 15): the block-major kernels' causal split as two launches. This tree
# against $1 (.old/s39v1, the gate fold), one process each: the 125M op at 8k / B=4 (two rounds) and 64k / B=1, then
# the GPU tests of the block-major kernels in bf16.
#   bash bench/calls/gpu_call39b.sh .old/s39v1
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s39v1}; budget=${BUDGET_S:-500}
ab_check_tree gpu_call39b "$base"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
for r in 1 2; do
  op . after8k$r 8192 4; op "$base" before8k$r 8192 4
  python3 bench/step_diff.py "$OUT/op_before8k$r.json" "$OUT/op_after8k$r.json" 2>&1 | head -12 | tee -a "$log"
done
op . after64k 65536 1; op "$base" before64k 65536 1
python3 bench/step_diff.py "$OUT/op_before64k.json" "$OUT/op_after64k.json" 2>&1 | head -12 | tee -a "$log"
ab_gpu_tests "sel_fwd_block or sel_block_passes or (bf16_matches and 125m) or packed_bf16 or f32_matches"
exit $rc
