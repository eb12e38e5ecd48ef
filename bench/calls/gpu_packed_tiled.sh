#!/usr/bin/env bash
# One device call (issue 16, seventh session): where the packed op's time goes, and whether the
# tiled selection kernels (whose per-tile union is bounded by the document) beat the gather
# kernels for packed rows. Device-busy profiles (bench/profile_op.py, B=1) unpacked and packed
# (mean document 2048, and 8192 = about one document per 8k row), auto vs sel_impl=tiled, at 8k
# and 64k; then the wall-time packed/unpacked ratio with tiled packed selection
# (bench/packed.py). JSON under $OUT; short table last.
set -u
OUT=${OUT:-/tmp/nsa_ptiled}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.
TMP=$(mktemp -d); LOG="$OUT/ptiled.log"; rc=0
run() { tag=$1; shift; timeout 150 python3 bench/profile_op.py --B 1 --reps 5 --top 30 "$@" \
          --out "$TMP/op_$tag.json" >> "$LOG" 2>&1 || rc=1; }
for T in 8192 65536; do
  run "unpacked_$T" --T $T
  run "packed2k_auto_$T" --T $T --packed-mean-doc 2048
  run "packed2k_tiled_$T" --T $T --packed-mean-doc 2048 --choices sel_impl=tiled
done
run "packed8k_auto_8192" --T 8192 --packed-mean-doc 8192
run "packed8k_tiled_8192" --T 8192 --packed-mean-doc 8192 --choices sel_impl=tiled
timeout 150 python3 bench/packed.py --T 8192 65536 --reps 20 --attention nsa \
  --packed-choices sel_impl=tiled > "$OUT/packed_tiled.jsonl" 2>> "$LOG" || rc=1
python3 bench/op_table.py "$TMP" "$OUT/ops_packed7.json"
grep -hE '"(fwd_bwd_ms|packed_speed_over_unpacked)"' "$OUT/packed_tiled.jsonl" | cut -c1-160
exit $rc
