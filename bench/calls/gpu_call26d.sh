#!/usr/bin/env bash
# One device call (twenty-sixth session, issue 14): the decode step (bench/decode.py, per token of the 16-token
# decode loop) of nsa_125m at 8k / 64k / 128k, B = 1 and 8, for the tree before the split rule ($1, carried) and
# this tree, alternating in one call; dense_125m at 64k / B=8 and 128k / B=1 at this tree (no decode change reaches it).
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd)
for tree in before after; do
  dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
  (cd "$dir" && PYTHONPATH=. timeout 200 python3 bench/decode.py --models nsa_125m --contexts 8192 65536 131072 \
    --batches 1 8 --reps 30 --out "$OUT/decode_nsa_$tree.json") > "$OUT/decode_$tree.log" 2>&1 || rc=1
  echo "$tree done at ${SECONDS}s"
done
PYTHONPATH=. timeout $((585 - SECONDS)) python3 bench/decode.py --models dense_125m --contexts 65536 131072 \
  --batches 1 8 --reps 30 --out "$OUT/decode_dense.json" > "$OUT/decode_dense.log" 2>&1 || rc=1
for f in before after dense; do echo "== $f"; grep -E "^(nsa|dense)_125m" "$OUT/decode_$f.log" | cut -c1-140; done
exit $rc
