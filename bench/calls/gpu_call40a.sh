#!/usr/bin/env bash
# One device call (fortieth session, issue 15): relaxed atomic dK/dV adds (pallas.atomics) and the tiled kernels' gate
# fold. Trees, one process each: this tree (fold + relaxed atomics), $1 (.old/s40, the session's start), $2
# (.old/s40f, the start + the fold of the tiled kernels), $3 (.old/s40split, this tree + the block-major backward's
# causal split of the thirty-ninth session). The 125M op at 8k / B=4 (this, start, split; two rounds of the first two)
# and 2k / B=16 (this, fold only, start), the bench-shape op at 64k (this, start), then the GPU tests of the kernels
# both changes reach, with the time left.
#   bash bench/calls/gpu_call40a.sh .old/s40 .old/s40f .old/s40split
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s40}; fold=${2:-.old/s40f}; split=${3:-.old/s40split}; budget=${BUDGET_S:-575}
for t in "$base" "$fold" "$split"; do ab_check_tree gpu_call40a "$t"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TREE TAG SHAPE T B SECONDS
  ab_profile "$1" "$2" "$6" bench/profile_op.py --shape "$3" --T "$4" --B "$5" --reps 3 --top 40 --out "$OUT/op_$2.json"
}
opdiff() { python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -12 | tee -a "$log"; }
for r in 1 2; do
  op . after8k$r 125m 8192 4 60; op "$base" before8k$r 125m 8192 4 60; opdiff before8k$r after8k$r
done
op "$split" split8k 125m 8192 4 60; opdiff after8k1 split8k
op . after2k 125m 2048 16 60; op "$fold" fold2k 125m 2048 16 60; op "$base" before2k 125m 2048 16 60
opdiff before2k fold2k; opdiff fold2k after2k
op . afterbench bench 65536 1 90; op "$base" beforebench bench 65536 1 90; opdiff beforebench afterbench
ab_gpu_tests "mosaic or bf16_matches or tiled_bf16 or sel_fwd_block or sel_block_passes or sel_dq_with_query or packed_bf16"
exit $rc
