#!/usr/bin/env bash
# One device call (nineteenth session, issue 14; 19a with the K loops unrolled and contiguous (pl.ds) loads): GPU decode tests (with the fused dense-part kernels); the
# dense parts' 12-layer chain, XLA vs the Pallas kernels at several tiles; the decode step at 64k / B=8, NSA
# and dense, before ($1: a tree without this session's changes) and now, each with a profiled loop call.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_decode_dense.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=. timeout 120 python3 bench/decode_dense.py --batches 8 64 \
  --variants 16:256 32:256 64:256 32:512 --out "$OUT/dense_chain.json" > "$OUT/dense_chain.log" 2>&1 || rc=1
cat "$OUT/dense_chain.log" | grep -E "^B=|Error"
(cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/old.json" > "$OUT/old.log" 2>&1) || rc=1
PYTHONPATH=. timeout 150 python3 bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/new.json" > "$OUT/new.log" 2>&1 || rc=1
echo "== before"; grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/old.log"
echo "== now"; grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/new.log"
python3 - "$OUT/new.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    pr = p.get("profile")
    if pr:
        print(p["model"], f"busy {pr['device_busy_ms_per_step']:.3f} ms")
        for o in pr["top_ops"][:14]:
            print(f"  {o['name'][:34]:34s} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):6.1f} us x{o['calls_per_step']:.0f}")
PY
exit $rc
