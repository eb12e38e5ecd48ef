#!/usr/bin/env bash
# One device call (forty-sixth session, issue 14): the decode step's MLP with RMSNorm folded into w_in (Block._mlp_step).
# First the Mosaic GPU tests call 1 did not reach and the GPU decode tests; then NSA at 64k / B=1 and 8 in the tree
# before (BEFORE) and this tree, alternated, one process each, the first of each with a trace at 64k / B=8 (kernels
# per token) and this tree's optimised HLO of that point.
#   bash bench/calls/gpu_call46b.sh BEFORE_TREE      (run from the fold's tree, 403c864: tests/test_step_folds.py and
#   Block._mlp_step exist only there and on wip/decode-norm-folds; the fold was reverted after this call)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
before=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning -rfE \
  tests/test_mosaic_window.py tests/test_decode.py tests/test_decode_dense.py \
  "tests/test_mosaic_tiled.py::test_gpu_mosaic_dkv_matches_reference_and_triton[256-2-1-64]" \
  tests/test_mosaic_tiled.py::test_gpu_full_nsa_with_mosaic_forward_bf16 > "$OUT/tests.log" 2>&1 || rc=1
timeout 60 python3 -m pytest -p no:cacheprovider -q -W ignore::DeprecationWarning -rfE tests/test_step_folds.py \
  >> "$OUT/tests.log" 2>&1 || rc=1      # the folds' tests on the GPU backend (they are CPU tests)
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -8 | tee -a "$log"
echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
mkdir -p "$OUT/hlo"
for run in before1 after1 before2 after2; do
  tree=.; [ "${run%?}" = before ] && tree=$before
  extra=(); [ "${run: -1}" = 1 ] && extra=(--profile 65536:8)
  [ "$run" = after1 ] && extra+=(--hlo-dump "$OUT/hlo")
  (cd "$tree" && PYTHONPATH=. timeout 90 python3 -W ignore::DeprecationWarning bench/decode.py --models nsa_125m \
    --contexts 65536 --batches 1 8 --reps 30 "${extra[@]}" --out "$OUT/nsa_$run.json") > "$OUT/nsa_$run.log" 2>&1 || rc=1
  grep -E "^nsa_125m" "$OUT/nsa_$run.log" | sed "s/^/$run  /" | tee -a "$log"
  [ "${run: -1}" = 1 ] && python3 bench/decode_summary.py "$OUT/nsa_$run.json" prof --top 14 | sed "s/^/$run  /" | tee -a "$log"
done
(cd "$OUT/hlo" && tar czf ../hlo.tgz . && cd .. && rm -rf hlo)
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
