#!/usr/bin/env bash
# One device call (eleventh session, last): the 125M training table at HEAD for the given points
# (bench/gpu_train_refresh.sh: NSA and dense in one process per point), then a decode profile at
# 128k context, batch 64 (bench/decode.py --profile, both models). JSON and logs under $OUT.
# Usage: bash bench/calls/gpu_final11.sh ["65536:1 8192:4"] [per-point timeout s]
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
OUT=$OUT bash bench/gpu_train_refresh.sh "${1:-65536:1 8192:4}" "${2:-190}" || rc=1
timeout 200 python3 bench/decode.py --contexts 131072 --batches 64 --reps 30 \
  --profile 131072:64 --out "$OUT/decode_128k_b64.json" > "$OUT/decode.log" 2>&1 || rc=1
python3 - "$OUT/decode_128k_b64.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
pts = d.get("points", d if isinstance(d, list) else [])
for p in pts:
    print({k: p[k] for k in p if k != "profile" and not isinstance(p[k], (dict, list))})
    pr = p.get("profile")
    if pr:
        print("  busy ms/step", round(pr["device_busy_ms_per_step"], 3), "kernels/step",
              pr["n_kernels_per_step"])
        for c, v in pr["by_category"].items():
            print("   %-30s %7.3f ms" % (c, v["ms_per_step"]))
        for o in pr["top_ops"][:25]:
            print("   %7.3f ms x%-4d %s" % (o["ms_per_step"], o["calls_per_step"], o["name"][:80]))
PY
exit $rc
