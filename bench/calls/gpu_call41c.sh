#!/usr/bin/env bash
# One device call (forty-first session, issue 15): the 125M op at 8k / B=4 with the selection routes and the block
# backward's tile rows (bench/profile_op.py, one process per setting; the default first and last).
#   bash bench/calls/gpu_call41c.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TAG PROFILE_OP_ARGS...
  local tag=$1; shift
  ab_profile . "$tag" 60 bench/profile_op.py --shape 125m --T 8192 --B 4 --reps 3 --top 40 \
    --out "$OUT/op_$tag.json" "$@"
}
opdiff() { python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -16 | tee -a "$log"; }
op default1
op query --choices sel_fwd=query
op queryblock --choices sel_fwd=query sel_dq=block
op rows128 --tiles sel_dq_rows=128 num_warps=8
op default2
for t in query queryblock rows128; do opdiff default1 $t; done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
