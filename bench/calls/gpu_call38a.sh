#!/usr/bin/env bash
# One device call (thirty-eighth session, issue 15): the scoring kernel's head sum without lane shuffles and its Eq. 9
# weights formed once. This tree against $1 (.old/s38, the session's start), one process each: the bench-shape op at
# 64k (bench/ab_op.sh, two rounds), then the 125M op at 8k / B=4 and 64k / B=1, then the GPU tests of the scoring
# kernel and of the bf16 op at the bench shape.
#   bash bench/calls/gpu_call38a.sh .old/s38
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s38}; budget=${BUDGET_S:-570}
ab_check_tree gpu_call38a "$base"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
mkdir -p "$OUT/bench_ab"; OUT="$OUT/bench_ab" bash bench/ab_op.sh "$base" bench:65536:1 260 2 || rc=1
op() {   # op TREE TAG T B
  ab_profile "$1" "$2" 80 bench/profile_op.py --shape 125m --T "$3" --B "$4" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
op . after8k 8192 4; op "$base" before8k 8192 4
python3 bench/step_diff.py "$OUT/op_before8k.json" "$OUT/op_after8k.json" 2>&1 | head -12 | tee -a "$log"
if [ $((SECONDS - t0)) -lt 380 ]; then
  op . after64k 65536 1; op "$base" before64k 65536 1
  python3 bench/step_diff.py "$OUT/op_before64k.json" "$OUT/op_after64k.json" 2>&1 | head -12 | tee -a "$log"
fi
ab_gpu_tests "scores_and_selection or (bf16_matches and bench) or packed_bf16"
exit $rc
