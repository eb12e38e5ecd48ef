#!/usr/bin/env bash
# One device call (forty-first session, issue 15): the block-major work-item size (BlockSizes.sel_chunk) at 8k / B=4
# and the compressed dK/dV split (KernelChoices.cmp_bwd_split) at 2k / B=16 after the relaxed atomics, one tree, one
# process per setting (bench/profile_op.py).
#   bash bench/calls/gpu_call41b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TAG T B -- PROFILE_OP_ARGS...
  local tag=$1 T=$2 B=$3; shift 3
  ab_profile . "$tag" 60 bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 3 --top 40 \
    --out "$OUT/op_$tag.json" "$@"
}
opdiff() { python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -12 | tee -a "$log"; }
for r in 1 2; do
  op chunk512_$r 8192 4; op chunk256_$r 8192 4 --tiles sel_chunk=256; opdiff chunk512_$r chunk256_$r
done
op chunk1024 8192 4 --tiles sel_chunk=1024; opdiff chunk512_1 chunk1024
op split16 2048 16; op split32 2048 16 --choices cmp_bwd_split=32; op split8 2048 16 --choices cmp_bwd_split=8
opdiff split16 split32; opdiff split16 split8
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
