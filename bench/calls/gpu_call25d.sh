#!/usr/bin/env bash
# One device call (twenty-fifth session, issue 15): the tournament top-n. GPU tests of the compiled top-n at 64k
# (distinct and tied scores) against the reference rule; the op at 125M 64k / B=1 profiled for the tree before
# ($1) and this tree (bench/profile_op.py); the 64k train step, NSA and dense in one process at this tree, then NSA
# of the tree before (bench/train_throughput.py) while time is left.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
PYTHONPATH=. timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_pallas_gpu.py \
  -k "topn_compiled" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "PASSED|FAILED|passed|failed" "$OUT/tests.log" | tail -4; echo "tests done at ${SECONDS}s"
for tree in before after; do
  dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
  echo "== $tree 64k (t=${SECONDS}s)" >> "$LOG"
  (cd "$dir" && PYTHONPATH=. timeout 60 python3 bench/profile_op.py --shape 125m --T 65536 --B 1 --reps 3 \
    --top 60 --out "$TMP/op_64k_$tree.json") >> "$LOG" 2>&1 || rc=1
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_topn nsa_topn__4 nsa_topn__5 nsa_topn__6 | tee -a "$LOG"
PYTHONPATH=. timeout 240 python3 bench/train_throughput.py --no-loader --models nsa_125m dense_125m \
  --points 65536:1 --steps 8 --out "$OUT/train_64k.json" > "$OUT/train.log" 2>&1 || rc=1
tail -3 "$OUT/train.log"; echo "train done at ${SECONDS}s"
(cd "$OLD" && PYTHONPATH=. timeout $((585 - SECONDS)) python3 bench/train_throughput.py --no-loader \
  --models nsa_125m --points 65536:1 --steps 8 --out "$OUT/train_64k_before.json") > "$OUT/train_before.log" 2>&1 || rc=1
tail -2 "$OUT/train_before.log"
exit $rc
