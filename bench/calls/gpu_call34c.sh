#!/usr/bin/env bash
# One device call (thirty-fourth session, issue 15): the 125M train step at 2k / B=16 and 4k / B=8 under jax.profiler
# (device busy per step), this tree (dQ chained through the compressed and tiled selection dQ kernels, dq_in as the
# accumulator's start; the window as before) against the session's starting tree ($1 = 97b8f87 carried as .old/s34),
# one process each; then the GPU parity tests of the op with the tiled selection.
#   bash bench/calls/gpu_call34c.sh .old/s34
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
before=${1:-.old/s34}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for tree in . "$before"; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  left=$((500 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  (cd "$tree" && PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/profile_step.py \
    --models nsa_125m --points 2048:16 4096:8 --steps 2 --top 60 --out "$OUT/step_$tag.json") 2>&1 \
    | grep -E "busy|rror" | grep -v "^WARNING" | sed "s/^/$tag /" | tee -a "$log" || rc=1
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
left=$((585 - (SECONDS - t0)))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -m gpu tests/test_pallas_gpu.py tests/test_pallas_tiled.py \
  -p no:cacheprovider -W ignore::DeprecationWarning \
  -k "(test_bf16_matches_f32_reference and 125m and 2048) or test_gpu_full_nsa_tiled" 2>&1 \
  | grep -E "passed|failed|rror|assert|^125m" | tail -8 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
