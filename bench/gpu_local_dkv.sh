#!/usr/bin/env bash
# One device call (issue 16, eighth session): the document-local dK/dV kernel (packed window)
# with a group's heads split over programs (BlockSizes.win_dkv_heads; 0 = all h in one
# program, today). GPU parity, then device-busy profiles of the packed NSA op
# (bench/profile_op.py, mean document 2048) at 8k B=1, 8k B=4 and 64k B=1. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_localdkv}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
TMP=$(mktemp -d); LOG="$OUT/localdkv.log"; rc=0
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_local.py \
  tests/test_triton_lowering.py -k "local" > "$OUT/tests.log" 2>&1 || rc=1
tail -n 1 "$OUT/tests.log"
run() { tag=$1; shift; timeout 100 python3 bench/profile_op.py --reps 5 --top 30 \
          --packed-mean-doc 2048 "$@" --out "$TMP/op_$tag.json" >> "$LOG" 2>&1 || rc=1; }
for hp in 0 1 2 3; do run "8k_B1_hp$hp" --T 8192 --B 1 --tiles win_dkv_heads=$hp; done
for hp in 0 1 2; do run "8k_B4_hp$hp" --T 8192 --B 4 --tiles win_dkv_heads=$hp; done
for hp in 0 1 2; do run "64k_B1_hp$hp" --T 65536 --B 1 --tiles win_dkv_heads=$hp; done
python3 bench/op_table.py "$TMP" "$OUT/ops_localdkv8.json" --op nsa_local_bwd_dkv
exit $rc
