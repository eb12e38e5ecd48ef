#!/usr/bin/env bash
# One device call (forty-fifth session, issue 14): the decode grid's B = 32 and 64 rows at 8k, 32k, 64k and 128k
# against the dense step with NSA's projection and RoPE treatment (forty-fourth session), NSA and dense in one
# process per batch; a trace of the loop at 128k / B = 64, the point of the "8x where dense is HBM-bound" target;
# first the Mosaic GPU kernels' GPU tests (their shared code moved to mosaic_common.py this session).
#   bash bench/calls/gpu_call45a.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
# the Mosaic GPU kernels' GPU parity after their shared pieces moved to mosaic_common.py (code unchanged)
timeout "${TESTS_S:-180}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_mosaic_tiled.py \
  tests/test_mosaic_window.py > "$OUT/tests.log" 2>&1 || rc=1
tail -3 "$OUT/tests.log" | tee -a "$log"; echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
for b in 32 64; do
  prof=(); [ "$b" = 64 ] && prof=(--profile 131072:64)
  PYTHONPATH=. timeout "${GRID_S:-190}" python3 -W ignore::DeprecationWarning bench/decode.py \
    --contexts 8192 32768 65536 131072 --batches $b --reps 30 "${prof[@]}" --out "$OUT/grid_b$b.json" \
    > "$OUT/grid_b$b.log" 2>&1 || rc=1
  grep -E "^(nsa|dense)_125m|rror" "$OUT/grid_b$b.log" | tail -12 | tee -a "$log"
  echo "  (B=$b done at $((SECONDS - t0)) s)" | tee -a "$log"
done
[ -f "$OUT/grid_b64.json" ] && python3 bench/decode_summary.py "$OUT/grid_b64.json" prof --top 16 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
