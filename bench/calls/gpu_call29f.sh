#!/usr/bin/env bash
# One device call (twenty-ninth session, issue 15): the peers table at 64k for the bench shape, only on an H200 (it
# exits at once on any other card: the H100 rows were measured in the twenty-eighth session). fla-core from the
# carried .whl, XunhaoLai from .peers/xunhao (carry both).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card"
case "$card" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 540 python3 -P bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
echo "peers done at ${SECONDS}s (rc=$rc)"
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 30
exit $rc
