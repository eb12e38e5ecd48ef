#!/usr/bin/env bash
# One device call (nineteenth session, issue 14): the compressed decode kernel's splits / tile / stages swept
# inside the real step (cold caches), 64k / B=8, NSA only, one process per variant, each profiled. The
# fifteenth session swept them on the kernels alone (warm L2) and nothing moved.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for v in "32 64 2" "64 64 2" "64 32 2" "128 32 2" "32 64 3" "16 64 2"; do set -- $v
  PYTHONPATH=.:bench timeout 120 python3 -c "
import sys, nsa_jax.pallas.decode as d
d.MAX_SPLITS = $1; d.nsa_decode_pallas.__kwdefaults__.update(cmp_keys=$2, cmp_stages=$3)
import decode; sys.exit(decode.main(sys.argv[1:]))" --models nsa_125m --contexts 65536 --batches 8 \
    --reps 30 --profile 65536:8 --out "$OUT/s$1_k$2_st$3.json" > "$OUT/s$1_k$2_st$3.log" 2>&1 || rc=1
  python3 - "$OUT/s$1_k$2_st$3.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    pr = p["loop_profile"]; ops = {o["name"]: o for o in pr["top_ops"]}
    us = lambda n: 1e3 * ops[n]["ms_per_step"] / ops[n]["calls_per_step"] if n in ops else float("nan")
    print(f"splits/keys/stages {sys.argv[2]}: loop {p['loop_ms']:.3f} ms busy/token {pr['device_busy_ms_per_step']:.3f} ms"
          f"  cmp {us('nsa_decode_cmp'):.1f} us  score {us('nsa_decode_score'):.1f}  finish {us('nsa_decode_finish'):.1f}")
PY
done
exit $rc
