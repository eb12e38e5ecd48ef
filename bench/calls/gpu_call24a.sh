#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): the softmax scale folded into the exponent in every
# training kernel. The op profiled (bench/profile_op.py, device busy per fwd+bwd) for the tree before ($1) and
# this tree, alternating: 125M 2k / B=16 and 8k / B=4 (two rounds), packed 8k / B=4 (mean document 2048) and
# the bench shape at 64k / B=1 (one round); then GPU parity of the tiled kernels.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
run() {  # tree tag shape T B [extra args]
  local tree=$1 tag=$2 shape=$3 T=$4 B=$5; shift 5
  local dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
  echo "== $tree $tag (t=${SECONDS}s)" >> "$LOG"
  (cd "$dir" && PYTHONPATH=. timeout 150 python3 bench/profile_op.py --shape $shape --T $T --B $B --reps 5 \
    --top 40 "$@" --out "$TMP/op_${tag}_${tree}.json") >> "$LOG" 2>&1 || rc=1
}
for round in 1 2; do
  for tree in before after; do
    run $tree "2k_r$round" 125m 2048 16
    run $tree "8k_r$round" 125m 8192 4
  done
done
for tree in before after; do
  run $tree packed8k 125m 8192 4 --packed-mean-doc 2048
  run $tree bench64k bench 65536 1
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_fwd nsa_sel_tiled_bwd_dq \
  nsa_sel_tiled_bwd_dkv nsa_sel_fwd_block nsa_sel_bwd_block nsa_local_fwd nsa_local_bwd_dkv nsa_cmp_scores \
  nsa_sel_fwd nsa_sel_bwd_dq nsa_sel_bwd_dkv | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
