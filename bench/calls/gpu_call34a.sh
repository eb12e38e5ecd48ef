#!/usr/bin/env bash
# One device call (thirty-fourth session, issue 15): the 125M train step at 2k / B=16 under jax.profiler (device busy
# per step, the XLA fusions), this tree (the window's output in cuDNN's dtype; dQ chained through the compressed and
# tiled selection dQ kernels) against the tree before ($1, a `git archive` carried as .old/s34), one process each;
# then the GPU parity tests of the op (bf16 against the float32 reference) that run the changed paths.
#   bash bench/calls/gpu_call34a.sh .old/s34
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
before=${1:-.old/s34}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for tree in . "$before"; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  left=$((420 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  (cd "$tree" && PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/profile_step.py \
    --models nsa_125m --points 2048:16 --steps 2 --top 60 --out "$OUT/step_$tag.json") 2>&1 \
    | grep -E "busy|rror" | grep -v "^WARNING" | sed "s/^/$tag /" | tee -a "$log" || rc=1
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
left=$((585 - (SECONDS - t0)))
[ "$left" -gt 40 ] && timeout "$left" python3 -m pytest -q -m gpu tests/test_pallas_gpu.py tests/test_pallas_tiled.py \
  -p no:cacheprovider -W ignore::DeprecationWarning \
  -k "test_bf16_matches_f32_reference or test_pallas_window_bf16 or test_gpu_full_nsa_tiled" 2>&1 \
  | grep -E "passed|failed|rror|assert|^125m|^bench" | tail -20 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
