#!/usr/bin/env bash
# One device call (sixteenth session, call 1): KernelChoices.streams "off" / "sel" / "all" at the bench
# shape and the 125M shape, 64k: the selection backward and the NSA op fwd+bwd, cuDNN dense beside them
# (bench/streams.py), then the GPU parity tests of the selection kernels (issue 15).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout ${STREAMS_S:-420} python3 bench/streams.py --shapes ${SHAPES:-bench 125m} --T 65536 \
  --out "$OUT/streams.json" > "$OUT/streams.log" 2>&1 || rc=1
grep -vE "^\s*$" "$OUT/streams.log" | tail -n 40
exit $rc
