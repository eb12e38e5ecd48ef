#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): name the XLA glue of the 125M train step at 2k / B=16, NSA and
# dense (bench/gpu_hlo.sh: profile_step with an XLA dump in the same process, then each top non-kernel op's HLO and
# JAX source). The twenty-fifth session's step profile put 7.7 ms per step more in XLA fusions in NSA than in dense.
#   bash bench/calls/gpu_call33e.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$OUT/card.txt"
bash bench/gpu_hlo.sh "nsa_125m:2048:16 dense_125m:2048:16"
