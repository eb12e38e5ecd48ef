#!/usr/bin/env bash
# One device call (fortieth session, issue 15): parity, then the 2k op and the training ratios. First the GPU tests of
# the kernels this session changed (relaxed dK/dV atomics: the block-major, inverted, compressed split kernels; the
# tiled dK/dV's gate fold: Triton and Mosaic GPU), capped at TESTS_S; then the 125M op at 2k / B=16, this tree against
# $1 (.old/s40, the session's start), one process each; then the 125M train step of NSA and dense in one process at
# 8k / B=4 and 2k / B=16 (bench/train_throughput.py --steps 8).
#   bash bench/calls/gpu_call40b.sh .old/s40
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
base=${1:-.old/s40}
ab_check_tree gpu_call40b "$base"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout ${TESTS_S:-230} python3 -m pytest -q -m gpu -p no:cacheprovider -W ignore::DeprecationWarning -rf \
  tests/test_mosaic_tiled.py tests/test_pallas_tiled.py tests/test_pallas_gpu.py \
  -k "mosaic or tiled_bf16 or (bf16_matches and 125m) or packed_bf16 or sel_dq_with_query or sel_block_passes" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -12 | tee -a "$log"
echo "tests done at $((SECONDS - t0)) s" | tee -a "$log"
for tree in . "$base"; do
  tag=$([ "$tree" = . ] && echo after2k || echo before2k)
  ab_profile "$tree" "$tag" 60 bench/profile_op.py --shape 125m --T 2048 --B 16 --reps 3 --top 40 --out "$OUT/op_$tag.json"
done
python3 bench/step_diff.py "$OUT/op_before2k.json" "$OUT/op_after2k.json" 2>&1 | head -14 | tee -a "$log"
left=$(( ${BUDGET_S:-580} - (SECONDS - t0) ))
PYTHONPATH=. timeout "$left" python3 -W ignore::DeprecationWarning bench/train_throughput.py --no-loader \
  --models nsa_125m dense_125m --points 8192:4 2048:16 --steps 8 --out "$OUT/train.json" > "$OUT/train.log" 2>&1 || rc=1
grep -E "^(model|nsa|dense)" "$OUT/train.log" | cut -c1-200 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
