#!/usr/bin/env bash
# One device call (twenty-sixth session, issue 15): the selection output kept once in q's dtype. GPU parity of the
# bf16 op and the block-major forward against the float32 reference; the op at 125M 64k / B=1 and 8k / B=4, the tree
# before ($1, carried) and this tree alternating, twice (bench/profile_op.py), with the merge fusions named.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
PYTHONPATH=. timeout 240 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_pallas_gpu.py \
  -k "test_bf16_matches_f32_reference or sel_fwd_block" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed" "$OUT/tests.log" | tail -2; echo "tests done at ${SECONDS}s"
for round in 1 2; do
  for tree in before after; do
    dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
    for pt in 65536:1 8192:4; do
      T=${pt%:*}; B=${pt#*:}
      echo "== $tree $pt round $round (t=${SECONDS}s)" >> "$LOG"
      (cd "$dir" && PYTHONPATH=. timeout 60 python3 bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 3 \
        --top 40 --out "$TMP/op_${T}_${tree}_r$round.json") >> "$LOG" 2>&1 || rc=1
    done
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op loop_add_fusion loop_reduce_fusion_1 \
  nsa_sel_fwd_block | tee -a "$LOG"
echo "done at ${SECONDS}s"
exit $rc
