#!/usr/bin/env bash
# One device call (twenty-seventh session, issue 14): the decode step's dense layers as row-skinny Pallas kernels
# (pallas/skinny.py). GPU tests of the kernels and of the decode path; the kernels alone against the XLA expression
# with a tile sweep (bench/skinny.py); the decode loop of nsa_125m and dense_125m at 64k, B = 1 and 8, with
# exec.decode_matmul=xla (before) and the default (pallas), each in its own process, the 64k / B=8 point profiled.
# Needs commit bb0320a's tree (pallas/skinny.py, bench/skinny.py and exec.decode_matmul, removed after).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -m gpu tests/test_skinny.py tests/test_decode.py -x > "$OUT/tests.log" 2>&1 || rc=1
tail -3 "$OUT/tests.log"; echo "tests done at ${SECONDS}s"
PYTHONPATH=. timeout 180 python3 bench/skinny.py --batches 1 8 64 \
  --variants default bn=32 bk=128 bk=512 stages=4 warps=8 --out "$OUT/skinny.json" > "$OUT/skinny.log" 2>&1 || rc=1
echo "skinny done at ${SECONDS}s"
for mode in xla pallas; do
  PYTHONPATH=. timeout 170 python3 bench/decode.py --models nsa_125m dense_125m --contexts 65536 --batches 1 8 \
    --reps 30 --profile 65536:8 --set exec.decode_matmul=$mode --out "$OUT/decode_$mode.json" \
    > "$OUT/decode_$mode.log" 2>&1 || rc=1
  echo "decode $mode done at ${SECONDS}s"
done
cat "$OUT/skinny.log" | grep busy | cut -c1-110
for mode in xla pallas; do echo "== $mode"; grep -E "^(nsa|dense)_125m" "$OUT/decode_$mode.log" | cut -c1-140; done
python3 - "$OUT" <<'PY'
import json, sys
for mode in ("xla", "pallas"):
    d = json.load(open(f"{sys.argv[1]}/decode_{mode}.json"))
    for p in d["points"]:
        lp = p.get("loop_profile")
        if lp:
            cats = {k: round(v["ms_per_step"], 3) for k, v in lp["by_category"].items()}
            print(mode, p["model"], p["context"], p["batch"], "loop", round(p["loop_ms"], 3), "busy",
                  round(lp["device_busy_ms_per_step"], 3), "kernels", lp["n_kernels_per_step"], cats)
PY
exit $rc
