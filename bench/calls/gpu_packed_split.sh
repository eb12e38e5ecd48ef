#!/usr/bin/env bash
# One device call (issue 16, eighth session): the packed compressed dK/dV kernel's query-range
# split (KernelChoices.cmp_bwd_split, 8 by default, chosen for unpacked 64k rows) for packed rows,
# whose key tiles see only their document's queries. Device-busy profiles of the packed op
# (bench/profile_op.py, mean document 2048) at 8k B=1, 8k B=4, 64k B=1. JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_psplit}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
TMP=$(mktemp -d); LOG="$OUT/psplit.log"; rc=0
run() { tag=$1; shift; timeout 100 python3 bench/profile_op.py --reps 5 --top 30 \
          --packed-mean-doc 2048 "$@" --out "$TMP/op_$tag.json" >> "$LOG" 2>&1 || rc=1; }
for s in 1 2 4 8; do
  run "8k_B1_split$s" --T 8192 --B 1 --choices cmp_bwd_split=$s
  run "8k_B4_split$s" --T 8192 --B 4 --choices cmp_bwd_split=$s
  run "64k_B1_split$s" --T 65536 --B 1 --choices cmp_bwd_split=$s
done
python3 bench/op_table.py "$TMP" "$OUT/ops_psplit8.json" --op nsa_cmp_bwd_dkv nsa_cmp_bwd_dkv_split
exit $rc
