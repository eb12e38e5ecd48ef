#!/usr/bin/env bash
# One device call (thirteenth session, final): GPU tests of the decode path and of the selection kernels
# at the bench shape on this tree; the decode step at 128k/B=64, NSA + dense in one process, twice (the
# first profiled). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py \
  "tests/test_pallas_gpu.py::test_bf16_matches_f32_reference" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
for i in 1 2; do
  prof=(); [[ $i == 1 ]] && prof=(--profile 131072:64)
  timeout 150 python3 bench/decode.py --contexts 131072 --batches 64 "${prof[@]}" \
    --out "$OUT/dec_$i.json" > "$OUT/dec_$i.log" 2>&1 || rc=1
  grep -E "^ *131072 " "$OUT/dec_$i.log" | tail -n 1
done
python3 - "$OUT/dec_1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    if "profile" in p and p["model"] == "nsa_125m":
        pr = p["profile"]
        print(f"busy {pr['device_busy_ms_per_step']:.3f} ms, {pr['n_kernels_per_step']:.0f} kernels")
        for o in pr["top_ops"][:20]:
            print(f"  {o['name'][:34]:34s} {1e3 * o['ms_per_step'] / max(o['calls_per_step'], 1):7.1f} us x{o['calls_per_step']:.0f}")
PY
exit $rc
