#!/usr/bin/env bash
# One device call (thirty-fourth session, issue 15): (1) the 125M 2k / B=16 train step under jax.profiler at the tree of
# call 1 ($1, a5414ae carried as .old/s34a: dq_in added after the key loop); (2) this tree (dq_in loaded as the dQ
# accumulator's start) through bench/gpu_hlo.sh, which profiles the same step with an XLA dump and names each top
# fusion's HLO and JAX source; (3) the GPU parity test of the op at the 125M shape, 2k.
#   bash bench/calls/gpu_call34b.sh .old/s34a
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"
base=${1:-.old/s34a}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
(cd "$base" && PYTHONPATH=. timeout 230 python3 -W ignore::DeprecationWarning bench/profile_step.py \
  --models nsa_125m --points 2048:16 --steps 2 --top 60 --out "$OUT/step_call1tree.json") 2>&1 \
  | grep -E "busy|rror" | grep -v "^WARNING" | sed "s/^/call1-tree /" | tee -a "$log"
echo "  (baseline done at $((SECONDS - t0)) s)" | tee -a "$log"
bash bench/gpu_hlo.sh "nsa_125m:2048:16" 2>&1 | grep -E "busy|^===|ms/step\)$" | head -3 | tee -a "$log"
echo "  (hlo done at $((SECONDS - t0)) s)" | tee -a "$log"
left=$((585 - (SECONDS - t0)))
[ "$left" -gt 40 ] && timeout "$left" python3 -m pytest -q -m gpu tests/test_pallas_gpu.py -p no:cacheprovider \
  -W ignore::DeprecationWarning -k "test_bf16_matches_f32_reference and 125m and 2048" 2>&1 \
  | grep -E "passed|failed|rror|assert|^125m" | tail -6 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
