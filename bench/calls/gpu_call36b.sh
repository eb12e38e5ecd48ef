#!/usr/bin/env bash
# One device call (thirty-sixth session, issue 15), at the tree with the block-major kernels' loads one tile ahead:
# the 125M 8k / B=4 train step of NSA and dense in one process (bench/train_throughput.py --steps 8); the peers table
# at 64k for the 125M shape (its op target, >= 3x cuDNN dense, last measured on an H100 in the twenty-eighth session;
# fla-core from the carried .whl, XunhaoLai from .peers/xunhao); then the GPU parity tests that run the block-major
# kernels, in the time left.
#   bash bench/calls/gpu_call36b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; t0=$SECONDS; log="$OUT/run.log"
budget=570
. bench/ab_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 150 python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 8192:4 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
echo "train done at $((SECONDS - t0)) s (rc=$rc)" | tee -a "$log"
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200 | tee -a "$log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout 260 python3 -P bench/peers.py --shapes 125m --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
echo "peers done at $((SECONDS - t0)) s (rc=$rc)" | tee -a "$log"
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 24 | tee -a "$log"
ab_gpu_tests "sel_fwd_block or sel_block_passes or 125m-8192 or packed_bf16"
exit $rc
