#!/usr/bin/env bash
# One device call (thirty-ninth session, issue 15): the session's whole change at 8k / B=4. The 125M op, this tree
# against $1 (.old/s39, the session's start), one process each; then the 8k / B=4 train step of NSA and dense in one
# process (bench/calls/gpu_call38c.sh, whose output lands in the same $OUT).
#   bash bench/calls/gpu_call39c.sh .old/s39
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s39}
ab_check_tree gpu_call39c "$base"
for tree in . "$base"; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  ab_profile "$tree" "$tag" 80 bench/profile_op.py --shape 125m --T 8192 --B 4 --reps 3 --top 40 --out "$OUT/op_$tag.json"
done
python3 bench/step_diff.py "$OUT/op_before.json" "$OUT/op_after.json" 2>&1 | head -14 | tee -a "$log"
TRAIN_S=${TRAIN_S:-330} bash bench/calls/gpu_call38c.sh || rc=1
exit $rc
