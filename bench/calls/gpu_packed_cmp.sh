#!/usr/bin/env bash
# One device call (issue 16, eighth session): with packed selection now on the block-major pair,
# is the packed compressed branch faster on cuDNN (grouped slots + document mask) than on the
# Pallas kernels (auto today)? Device-busy profiles of the packed op (bench/profile_op.py)
# at 8k (mean document 2k and 8k; B=1 and B=4) and 64k; then the GPU test files the index change
# touches. JSON under $OUT; short table last.
set -u
OUT=${OUT:-/tmp/nsa_pcmp}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
TMP=$(mktemp -d); LOG="$OUT/pcmp.log"; rc=0
run() { tag=$1; shift; timeout 100 python3 bench/profile_op.py --reps 5 --top 30 "$@" \
          --out "$TMP/op_$tag.json" >> "$LOG" 2>&1 || rc=1; }
for c in pallas cudnn; do
  run "8k_B1_doc2k_$c" --T 8192 --B 1 --packed-mean-doc 2048 --choices cmp_attn=$c
  run "8k_B1_doc8k_$c" --T 8192 --B 1 --packed-mean-doc 8192 --choices cmp_attn=$c
  run "8k_B4_doc2k_$c" --T 8192 --B 4 --packed-mean-doc 2048 --choices cmp_attn=$c
  run "64k_B1_doc2k_$c" --T 65536 --B 1 --packed-mean-doc 2048 --choices cmp_attn=$c
done
timeout 280 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py \
  tests/test_pallas_tiled.py > "$OUT/tests.log" 2>&1 || rc=1
tail -n 1 "$OUT/tests.log"
python3 bench/op_table.py "$TMP" "$OUT/ops_pcmp8.json"
exit $rc
