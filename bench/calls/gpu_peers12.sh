#!/usr/bin/env bash
# One device call (twelfth session): the decode emission's tile sweep (bench/phi_decode.py, issue 14),
# then the peers table at T = 64k, bench and 125M shapes (bench/peers.py, issue 15; carry .whl with
# fla-core and .peers/xunhao with XunhaoLai's checkout). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
VARS=${1:-"xla default rows=16 h_tile=32 h_tile=16 k_tile=256 rows=16,k_tile=512 stages=3 stages=4 h_tile=32,k_tile=256,stages=3 warps=8"}
PYTHONPATH=. timeout 150 python3 bench/phi_decode.py --batches 64 8 --variants $VARS \
  --out "$OUT/phi_decode.json" > "$OUT/phi_decode.log" 2>&1 || rc=1
grep "B=" "$OUT/phi_decode.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 400 python3 bench/peers.py --shapes bench 125m --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers_h200.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 30
exit $rc
