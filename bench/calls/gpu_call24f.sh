#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): the membership bits with the tile lists read from the same
# table (one scatter of the selection per pass, tiled_index.tile_lists). The op profiled (bench/profile_op.py,
# device busy per fwd+bwd) for the tree before the bits ($1) and this tree, alternating, 125M 2k / B=16, two
# rounds. The kernels are call 5's (gpu_call24e.sh); only the index built in XLA differs.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for round in 1 2; do
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
    echo "== $tree 2k round $round (t=${SECONDS}s)" >> "$LOG"
    (cd "$dir" && PYTHONPATH=. timeout 60 python3 bench/profile_op.py --shape 125m --T 2048 --B 16 --reps 5 \
      --top 60 --out "$TMP/op_2k_r${round}_$tree.json") >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_fwd nsa_sel_tiled_bwd_dq \
  nsa_sel_tiled_bwd_dkv input_scatter_fusion input_scatter_fusion_1 input_scatter_fusion_2 | tee -a "$LOG"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
