#!/usr/bin/env bash
# One device call (forty-second session, issues 14 and 15), the session's last device time: first the three GPU tests
# that call 2 (gpu_call42a.sh, 8 xdist workers on one GPU) lost to out-of-memory errors between workers, run again
# in one process; then the decode grid's points the fair grid lacked (32k x 1 / 8 / 32 / 64, and B=32 at 64k and
# 128k; bench/calls/gpu_call42c.sh). Each stage capped so the whole fits the time left.
#   bash bench/calls/gpu_call42d.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -rfE \
  "tests/test_pallas_gpu.py::test_no_nan_at_64k[pallas]" \
  "tests/test_pallas_tiled.py::test_gpu_full_nsa_tiled_bf16[8192]" \
  "tests/test_pallas_tiled.py::test_gpu_tiled_selection_bf16[8192]" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "PASSED|FAILED|passed|failed" "$OUT/tests.log" | tail -8 | tee -a "$log"
echo "tests done at $((SECONDS - t0)) s" | tee -a "$log"
GRID_S=${GRID_A_S:-150} bash bench/calls/gpu_call42c.sh a 32768 | tee -a "$log" || rc=1
GRID_S=${GRID_B_S:-100} BATCHES=32 bash bench/calls/gpu_call42c.sh b 65536 131072 | tee -a "$log" || rc=1
cd "$OUT" && tar czf grid_logs.tgz grid42*.log run_*.log && rm -f grid42*.log run_*.log
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
