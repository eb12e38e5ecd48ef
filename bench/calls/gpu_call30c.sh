#!/usr/bin/env bash
# One device call (thirtieth session, issue 15): the document-local kernel's tiles and warps at the bench head shape
# (64 / 4 / 128), the packed window branch at 64k (bench/window_tiles.py), where call 3 found the kernel 3.1x slower
# than jax's own Pallas Triton attention on dense causal attention.
#   bash bench/calls/gpu_call30c.sh
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$log"
PYTHONPATH=. timeout 500 python3 -W ignore::DeprecationWarning bench/window_tiles.py --shape bench --T 65536 \
  --variants default num_warps=4 win_q=128,win_keys=128 win_q=128 win_q=128,num_warps=4 win_keys=128 \
  num_stages=3 win_q=128,win_keys=128,num_stages=3 win_q=128,win_keys=32 \
  > "$OUT/tiles.log" 2>"$OUT/stderr.log" || rc=1
grep '^{"variant' "$OUT/tiles.log" | tee -a "$log"; tail -n 1 "$OUT/tiles.log" > "$OUT/tiles.json"
tail -n 20 "$OUT/stderr.log" > "$OUT/stderr_tail.log"; rm -f "$OUT/stderr.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
