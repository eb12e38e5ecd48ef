#!/usr/bin/env bash
# GPU suite for the NSA Pallas kernels, run from the repo root on the device machine:
#   bench/gpu_suite.sh [all|smoke|tests|quicktests|bench|sweep] [bench/kernels.py args...]
# Compiles and checks every kernel once (bench/kernels.py --smoke), runs the @gpu tests (tests/test_pallas_gpu.py), then bench/kernels.py; logs, JSON and PNG go
# to $OUT (default /tmp/nsa_gpu_out). Prints a short table last.
set -u
stage=${1:-all}; shift || true
OUT=${OUT:-/tmp/nsa_gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu \
  --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
rc=0
if [[ $stage == all || $stage == smoke ]]; then
  python3 bench/kernels.py --smoke > "$OUT/smoke.log" 2>&1 || rc=1
  grep -E "ok|FAILED|Error" "$OUT/smoke.log" | head -n 40
fi
if [[ $stage == all || $stage == tests || $stage == quicktests ]]; then
  sel=(); [[ $stage == quicktests ]] && sel=(-k "bench-8192 or 64k")
  python3 -m pytest -q -m gpu tests/test_pallas_gpu.py -rfE -s --durations=10 "${sel[@]}" \
    > "$OUT/pytest.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)|passed|failed|bench |125m |Error" "$OUT/pytest.log" | tail -n 25
fi
if [[ $stage == sweep ]]; then
  python3 bench/kernels.py --out "$OUT/kernels_h200.json" "$@" > "$OUT/sweep.log" 2>&1 || rc=1
  cat "$OUT/sweep.log" | grep -v Warning | tail -n 40
fi
if [[ $stage == all || $stage == bench ]]; then
  python3 bench/kernels.py --out "$OUT/kernels_h200.json" "$@" > "$OUT/bench.log" 2>&1 || rc=1
  python3 bench/plot_kernels.py "$OUT/kernels_h200.json" "$OUT/kernels_h200.png" \
    >> "$OUT/bench.log" 2>&1
  grep -E "FAILED|Error" "$OUT/bench.log" | head -n 20
  sed -n '/^shape  T/,$p' "$OUT/bench.log"
fi
exit $rc
