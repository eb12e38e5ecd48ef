#!/usr/bin/env bash
# One device call (issues 15/16, seventh session): the gate-gradient reductions kept out of the
# stack, and width-bucketed top-n for packed rows. GPU parity, then the op profiled before
# (BEFORE tree, default .old/pre7) and after in the same call, the packed op profiled, and the
# packed/unpacked op timing before and after. JSON under $OUT; short table last.
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
python3 - "$TMP" "$OUT" <<'PY'
import glob, json, os, sys
tmp, out = sys.argv[1:]
ops = {os.path.basename(f)[3:-5]: json.load(open(f)) for f in sorted(glob.glob(tmp + "/op_*.json"))}
json.dump(ops, open(out + "/ops7.json", "w"), indent=1)
packed = {t: [json.loads(l) for l in open(f"{tmp}/packed_{t}.jsonl") if l.startswith("{")]
          for t in ("before", "after") if os.path.exists(f"{tmp}/packed_{t}.jsonl")}
json.dump(packed, open(out + "/packed7.json", "w"), indent=1)
print("op device ms per call:")
for k, r in ops.items():
    top = {o["name"]: o["ms_per_step"] for o in r["top_ops"]}
    print(f"  {k:22s} busy {r['device_busy_ms_per_step']:7.3f}  concat59/input_concatenate_fusion "
          f"{top.get('input_concatenate_fusion', 0):.3f}")
for t, rows in packed.items():
    for r in rows:
        if "fwd_bwd_ms" in r or "packed_speed_over_unpacked" in r:
            print(" ", t, r.get("T"), r.get("mode", "ratio"), r.get("fwd_bwd_ms", r.get("packed_speed_over_unpacked")))
PY
exit $rc
