#!/usr/bin/env bash
# One device call (nineteenth session, issue 14): GPU decode tests; the decode step at 64k / B=8, NSA and
# dense, before ($1: a tree without this session's changes) and now (each residual add + RMSNorm as one kernel,
# pallas/add_norm.py), each with a profiled loop call.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_add_norm.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
(cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/old.json" > "$OUT/old.log" 2>&1) || rc=1
PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/new.json" > "$OUT/new.log" 2>&1 || rc=1
echo "== before"; grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/old.log"
echo "== now"; grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/new.log"
python3 - "$OUT/old.json" "$OUT/new.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
  d = json.load(open(f)); print("==", f.split("/")[-1])
  for p in d["points"]:
    pr = p.get("profile")
    if pr and p["model"] == "nsa_125m":
        print(p["model"], f"busy {pr['device_busy_ms_per_step']:.3f} ms")
        for o in pr["top_ops"][:20]:
            print(f"  {o['name'][:34]:34s} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):6.1f} us x{o['calls_per_step']:.0f}")
PY
exit $rc
