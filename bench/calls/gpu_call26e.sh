#!/usr/bin/env bash
# One device call (twenty-sixth session, issue 15): the peers table at the bench shape, 64k, on this tree
# (bench/peers_run.sh: fla-core from the carried .whl, XunhaoLai from .peers/xunhao; our selection kernels, the
# op and cuDNN dense in the same process): the bench-shape rows were last measured in the twenty-fourth session,
# before the tournament top-n. Carry .whl and .peers/xunhao.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PEERS_S=480 source bench/peers_run.sh
echo "peers done at ${SECONDS}s"
exit $rc
