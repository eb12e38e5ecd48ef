#!/usr/bin/env bash
# One device call (issues 15/16, seventh session): the gate-gradient reductions kept out of the
# stack, and width-bucketed top-n for packed rows. GPU parity, then the op profiled before
# (BEFORE tree, default .old/pre7) and after in the same call, the packed op profiled, and the
# packed/unpacked op timing before and after. JSON under $OUT; short table last. (The seventh
# session's run kept both packed timings in one packed7.json; this version copies the two files.)
set -u
OUT=${OUT:-/tmp/nsa_gate}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
BEFORE=${BEFORE:-.old/pre7}; HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/gate.log"; rc=0
PYTHONPATH=. timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py \
  -k "(bf16_matches and 125m) or packed_bf16" > "$OUT/tests.log" 2>&1 || rc=1
tail -n 2 "$OUT/tests.log"
for tree in before after; do
  dir=$HERE; [ $tree = before ] && dir=$HERE/$BEFORE
  for p in "2048 16" "8192 4"; do set -- $p
    (cd "$dir" && PYTHONPATH=. timeout 120 python3 bench/profile_op.py --T $1 --B $2 --reps 5 \
      --top 40 --out "$TMP/op_${tree}_$1.json") >> "$LOG" 2>&1 || rc=1
  done
  (cd "$dir" && PYTHONPATH=. timeout 150 python3 bench/packed.py --T 8192 65536 --reps 20 \
    --attention nsa) > "$TMP/packed_$tree.jsonl" 2>> "$LOG" || rc=1
done
for m in "" "--packed-mean-doc 2048"; do tag=unpacked; [ -n "$m" ] && tag=packed
  PYTHONPATH=. timeout 120 python3 bench/profile_op.py --T 8192 --B 1 --reps 5 --top 40 $m \
    --out "$TMP/op_${tag}_8192_b1.json" >> "$LOG" 2>&1 || rc=1
done
python3 bench/op_table.py "$TMP" "$OUT/ops7.json" --op input_concatenate_fusion
for t in before after; do [ -f "$TMP/packed_$t.jsonl" ] && cp "$TMP/packed_$t.jsonl" "$OUT/packed_$t.jsonl"
  echo "$t:"; grep -hE '"(fwd_bwd_ms|packed_speed_over_unpacked)"' "$TMP/packed_$t.jsonl" | cut -c1-160; done
exit $rc
