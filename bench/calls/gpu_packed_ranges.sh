#!/usr/bin/env bash
# One device call (issue 16, eighth session): packed rows through the block-major selection
# kernels, each (query, block) pair listed once under an l'-key range (an aligned block, or the
# range from the block's first key when it crosses an aligned boundary), so n slots as unpacked.
# GPU parity, then device-busy profiles (bench/profile_op.py, B=1) of the tree before (.old/pre8:
# packed auto = gather kernels) and this tree (packed auto = block-major; sel_fwd=query forces
# the gather pair), packed (mean document 2048; 8192 = long documents) and unpacked.
# JSON under $OUT; short table last.
set -u
OUT=${OUT:-/tmp/nsa_pranges}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/pranges.log"; rc=0
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py \
  -k "packed_bf16 or sel_fwd_block or sel_block_passes" > "$OUT/tests.log" 2>&1 || rc=1
tail -n 1 "$OUT/tests.log"
GATHER="--choices sel_fwd=query sel_dq=query"
run() { dir=$1; tag=$2; shift 2; (cd "$dir" && PYTHONPATH=. timeout 120 python3 bench/profile_op.py \
          --B 1 --reps 5 --top 30 "$@" --out "$TMP/op_$tag.json") >> "$LOG" 2>&1 || rc=1; }
for T in 8192 65536; do
  run "$HERE/.old/pre8" "before_packed2k_$T" --T $T --packed-mean-doc 2048
  run "$HERE" "after_packed2k_$T" --T $T --packed-mean-doc 2048
  run "$HERE" "after_packed2k_gather_$T" --T $T --packed-mean-doc 2048 $GATHER
  run "$HERE" "after_unpacked_$T" --T $T
done
run "$HERE/.old/pre8" "before_unpacked_8192" --T 8192
run "$HERE/.old/pre8" "before_packed8k_8192" --T 8192 --packed-mean-doc 8192
run "$HERE" "after_packed8k_8192" --T 8192 --packed-mean-doc 8192
python3 bench/op_table.py "$TMP" "$OUT/ops_pranges8.json"
exit $rc
