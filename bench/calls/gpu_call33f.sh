#!/usr/bin/env bash
# One device call (thirty-third session, issue 15): the 125M train step at 2k / B=16 under jax.profiler (device busy
# per step and the XLA fusions), this tree (the three gate sums as one reduction; the window's saved output in bf16)
# against the tree before ($1, a `git archive` carried as .old/s33), one process each; then the GPU parity tests of
# the op at the 125M shape, 2k (window on cuDNN, gate gradients).
#   bash bench/calls/gpu_call33f.sh .old/s33
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
before=${1:-.old/s33}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for tree in . "$before"; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  left=$((560 - (SECONDS - t0))); [ "$left" -lt 60 ] && break
  (cd "$tree" && PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/profile_step.py \
    --models nsa_125m --points 2048:16 --steps 2 --top 60 --out "$OUT/step_$tag.json") 2>&1 \
    | grep -E "busy|rror" | grep -v "^WARNING" | sed "s/^/$tag /" | tee -a "$log" || rc=1
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
done
left=$((585 - (SECONDS - t0)))
[ "$left" -gt 40 ] && timeout "$left" python3 -m pytest -q -m gpu tests/test_pallas_gpu.py -p no:cacheprovider \
  -k "test_bf16_matches_f32_reference and 125m and 2048" -W ignore::DeprecationWarning 2>&1 \
  | grep -E "passed|failed|rror|assert" | tail -6 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
