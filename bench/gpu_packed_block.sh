#!/usr/bin/env bash
# One device call (issue 16, seventh session): packed rows through the block-major selection
# kernels with one entry per selected block (items walk two aligned key blocks) instead of 2n
# half-block slots. GPU parity, then device-busy profiles (bench/profile_op.py, B=1): the tree
# before (.old/pre7, with this tree's profile_op.py) and this tree, packed (mean document 2048;
# 8192 = long documents) with sel_fwd/sel_dq auto and block, and unpacked. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_pblock}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/pblock.log"; rc=0
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py \
  -k "packed_bf16 or sel_fwd_block" > "$OUT/tests.log" 2>&1 || rc=1
tail -n 1 "$OUT/tests.log"
BLK="--choices sel_impl=gather sel_fwd=block sel_dq=block"
run() { dir=$1; tag=$2; shift 2; (cd "$dir" && PYTHONPATH=. timeout 120 python3 bench/profile_op.py \
          --B 1 --reps 5 --top 30 "$@" --out "$TMP/op_$tag.json") >> "$LOG" 2>&1 || rc=1; }
for T in 8192 65536; do
  run "$HERE/.old/pre7" "before_packed2k_auto_$T" --T $T --packed-mean-doc 2048
  run "$HERE" "after_packed2k_auto_$T" --T $T --packed-mean-doc 2048
  run "$HERE" "after_packed2k_block_$T" --T $T --packed-mean-doc 2048 $BLK
  run "$HERE" "unpacked_$T" --T $T
done
run "$HERE" "after_packed8k_block_8192" --T 8192 --packed-mean-doc 8192 $BLK
run "$HERE" "after_packed8k_auto_8192" --T 8192 --packed-mean-doc 8192
python3 bench/op_table.py "$TMP" "$OUT/ops_pblock7.json"
exit $rc
