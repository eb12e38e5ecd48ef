#!/usr/bin/env bash
# One device call (forty-second session, issues 14 and 15): the whole GPU test suite at this tree
# (`pytest -m gpu tests`, every file; earlier calls ran -k subsets of the kernels they changed), with
# pytest-xdist workers where the image has it (each worker its own process, no preallocated GPU memory).
#   bash bench/calls/gpu_call42a.sh            # TESTS_S (default 540) caps pytest, WORKERS (default 8)
# Verbose (-v): with xdist each finished test is a line, so a run cut by the cap still names its failures.
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1 | tee "$log"
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'devices', jax.devices())" 2>&1 | tail -1 | tee -a "$log"
# the tree that travelled: checksums of every tracked module (compared with the commit after the call)
find nsa_jax -name "*.py" | LC_ALL=C sort | xargs md5sum | md5sum | sed "s/^/nsa_jax checksum: /" | tee -a "$log"
workers=()
if python3 -c "import xdist" 2>/dev/null; then workers=(-n "${WORKERS:-8}"); fi
echo "pytest workers: ${workers[*]:-none (no pytest-xdist)}" | tee -a "$log"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${TESTS_S:-540}" python3 -m pytest -m gpu tests \
  -p no:cacheprovider -v -rfE --durations=25 "${workers[@]}" --junitxml="$OUT/gpu_tests.xml" \
  > "$OUT/tests.log" 2>&1
rc=$?
echo "pytest rc=$rc at $((SECONDS - t0)) s" | tee -a "$log"
grep -E "(FAILED|ERROR|XFAIL)|passed|failed" "$OUT/tests.log" | tail -30 | tee -a "$log"
grep -cE "PASSED" "$OUT/tests.log" | sed "s/^/PASSED lines: /" | tee -a "$log"
exit $rc
