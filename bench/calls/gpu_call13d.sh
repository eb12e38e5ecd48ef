#!/usr/bin/env bash
# One device call (thirteenth session, issue 14): GPU decode tests; the decode step before ($1, a tree
# without this session's decode changes; NSA only) and now (NSA + dense) at 128k/B=64 (profiled) and
# 64k/B=8, XLA's default flags, per token in the 16-token loop. JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
for pt in "131072 64" "65536 8"; do set -- $pt
  (cd "$OLD" && PYTHONPATH=. timeout 120 python3 bench/decode.py --models nsa_125m --contexts $1 \
    --batches $2 --out "$OUT/old_$1_$2.json" > "$OUT/old_$1_$2.log" 2>&1) || rc=1
  prof=(); [[ $1 == 131072 ]] && prof=(--profile 131072:64)
  PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts $1 --batches $2 "${prof[@]}" \
    --out "$OUT/new_$1_$2.json" > "$OUT/new_$1_$2.log" 2>&1 || rc=1
  echo "== $1/$2 before"; grep -E "^nsa_125m" "$OUT/old_$1_$2.log" | tail -n 1
  echo "== $1/$2 now"; grep -E "^(nsa|dense)_125m|^ *$1 " "$OUT/new_$1_$2.log" | tail -n 3
done
python3 - "$OUT/new_131072_64.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    if "profile" in p:
        pr = p["profile"]
        print(f"busy {pr['device_busy_ms_per_step']:.3f} ms, {pr['n_kernels_per_step']:.0f} kernels")
        for o in pr["top_ops"][:24]:
            print(f"  {o['name'][:34]:34s} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):7.1f} us x{o['calls_per_step']:.0f}")
PY
exit $rc
