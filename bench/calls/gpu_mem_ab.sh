#!/usr/bin/env bash
# One device call (issue 15, seventh session): the 64k compiled peak of the train step before the
# gate-gradient change (.old/pre7), with the barrier on all three sums (this tree), and with a
# barrier on the compressed sum only (.old/var_c); var_c's op profile at 2k/8k; then NSA training
# tok/s before vs this tree at 2k and 8k in the same call. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_mem_ab}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
HERE=$(pwd); LOG="$OUT/mem_ab.log"; rc=0
for tree in before after var_c; do
  dir=$HERE; [ $tree = before ] && dir=$HERE/.old/pre7; [ $tree = var_c ] && dir=$HERE/.old/var_c
  (cd "$dir" && PYTHONPATH=. timeout 150 python3 bench/train_memory.py --points 65536:1 \
    --out "$OUT/mem_$tree.json") >> "$LOG" 2>&1 || rc=1
  echo "== $tree: $(grep -ho '"compiled_peak_gb": [0-9.]*' "$OUT/mem_$tree.json" | head -1)"
done
for p in "2048 16" "8192 4"; do set -- $p
  (cd .old/var_c && PYTHONPATH=. timeout 100 python3 bench/profile_op.py --T $1 --B $2 --reps 5 \
    --top 30 --out "$OUT/op_var_c_$1.json") >> "$LOG" 2>&1 || rc=1
done
grep "device busy" "$LOG"
for tree in before after; do
  dir=$HERE; [ $tree = before ] && dir=$HERE/.old/pre7
  (cd "$dir" && PYTHONPATH=. timeout 200 python3 bench/train_throughput.py --no-loader \
    --models nsa_125m --points 2048:16 8192:4 --steps 8 --out "$OUT/train_$tree.json") >> "$LOG" 2>&1 || rc=1
  echo "== $tree"; grep -E "^nsa_125m " "$LOG" | tail -2
done
exit $rc
