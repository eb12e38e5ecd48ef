#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): the peers table at the bench shape, 64k, on this tree
# (bench/peers_run.sh: fla-core from the carried .whl, XunhaoLai from .peers/xunhao; our selection kernels, the
# op and cuDNN dense in the same process), then 125M training at 64k / B=1, NSA and dense in one process
# (bench/train_throughput.py --steps 8). Carry .whl and .peers/xunhao.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PEERS_S=320 source bench/peers_run.sh
echo "peers done at ${SECONDS}s"
PYTHONPATH=. timeout $((585 - SECONDS)) python3 -P bench/train_throughput.py --no-loader --points 65536:1 \
  --models nsa_125m dense_125m --steps 8 --out "$OUT/train_64k.json" > "$OUT/train.log" 2>&1 || rc=1
python3 - "$OUT/train_64k.json" <<'PY' || rc=1
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["points"]:
    if "step_ms" in r:
        print("%10s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (r["model"], r["seq_len"], r["batch"],
              r["step_ms"], r["tokens_per_s"], r.get("compiled_peak_gb") or 0))
PY
echo "done at ${SECONDS}s"
exit $rc
