#!/usr/bin/env bash
# One device call (twenty-eighth session, issue 15): the peers table at 64k for the 125M shape (its op target, >= 3x
# cuDNN dense, last measured in the twelfth session) and then the bench shape, in one process (bench/peers.py
# rewrites its JSON after each shape). fla-core from the carried .whl, XunhaoLai from .peers/xunhao (carry both).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 570 python3 -P bench/peers.py --shapes 125m bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
echo "peers done at ${SECONDS}s (rc=$rc)"
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 30
exit $rc
