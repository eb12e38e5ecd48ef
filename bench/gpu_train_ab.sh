#!/usr/bin/env bash
# One device call (issue 15, seventh session): NSA 125M training tok/s before (BEFORE tree,
# default .old/pre7) and after the gate-gradient change, in the same call, at 2k and 8k.
set -u
OUT=${OUT:-/tmp/nsa_train_ab}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
BEFORE=${BEFORE:-.old/pre7}; HERE=$(pwd); LOG="$OUT/train_ab.log"; rc=0
for tree in before after after2 before2; do
  dir=$HERE; case $tree in before*) dir=$HERE/$BEFORE;; esac
  (cd "$dir" && PYTHONPATH=. timeout 200 python3 bench/train_throughput.py --no-loader \
    --models nsa_125m --points 2048:16 8192:4 --steps 8 --out "$OUT/train_$tree.json") >> "$LOG" 2>&1 || rc=1
  echo "== $tree"; grep -E "^nsa_125m " "$LOG" | tail -2
done
exit $rc
