#!/usr/bin/env bash
# One device call (nineteenth session, issue 14): GPU decode tests; the decode step at 64k / B=8 for the tree
# before ($1) and this tree with the fused step projection unpadded (model.STEP_ALIGN = 1) and padded to 128
# columns (the default), NSA; dense once; each with a profiled loop call.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  tests/test_pallas_decode_select.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
ARGS="--contexts 65536 --batches 8 --reps 30 --profile 65536:8"
(cd "$OLD" && PYTHONPATH=. timeout 150 python3 bench/decode.py --models nsa_125m $ARGS \
  --out "$OUT/old.json" > "$OUT/old.log" 2>&1) || rc=1
for A in 1 128; do
  M="--models nsa_125m"; [[ $A == 128 ]] && M=""
  PYTHONPATH=.:bench timeout 150 python3 -c "
import sys, nsa_jax.model as m; m.STEP_ALIGN = $A
import decode; sys.exit(decode.main(sys.argv[1:]))" $M $ARGS --out "$OUT/align$A.json" \
    > "$OUT/align$A.log" 2>&1 || rc=1
done
for f in old align1 align128; do echo "== $f"; grep -E "^(nsa|dense)_125m|loop profile|Error" "$OUT/$f.log"; done
python3 - "$OUT/old.json" "$OUT/align1.json" "$OUT/align128.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
  d = json.load(open(f))
  for p in d["points"]:
    pr = p.get("profile")
    if pr and p["model"] == "nsa_125m":
      g = [o for o in pr["top_ops"] if o["name"].startswith("gemm")]
      print(f.split("/")[-1], f"busy {pr['device_busy_ms_per_step']:.3f} ms;", "  ".join(
        f"{o['name']} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):.1f}us x{o['calls_per_step']:.0f}" for o in g))
PY
exit $rc
