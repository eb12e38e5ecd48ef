#!/usr/bin/env bash
# Decode checks and benchmarks on the device machine, from the repo root:
#   bench/decode_gpu.sh [profile|grid|all] [extra bench/decode.py args...]
# profile: GPU decode tests; the decode step before this change (carried .old/before.tar, the
#          tree of commit 3f3b251) and after it at 64k, B = 1 and 8, same call; HLO in-place
#          check; jax.profiler summaries; command buffers off for comparison.
# grid:    bench/decode.py over contexts 8k-128k x batches 1-64 for both models.
# JSON and logs go to $OUT. Prints a short table last.
set -u
stage=${1:-all}; shift || true
OUT=${OUT:-/tmp/nsa_decode_out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
rc=0
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$OUT/env.txt"
if [[ $stage == profile || $stage == all ]]; then
  python3 -m pytest -q -m gpu tests/test_decode.py -rfE > "$OUT/pytest_decode.log" 2>&1 || rc=1
  tail -n 3 "$OUT/pytest_decode.log"
  if [[ -f .old/before.tar ]]; then
    mkdir -p /tmp/before && tar -xf .old/before.tar -C /tmp/before
    (cd /tmp/before && PYTHONPATH=. python3 bench/decode.py --contexts 65536 --batches 1 8 \
      --reps 30 --out "$OUT/decode_before.json" > "$OUT/before.log" 2>&1) || rc=1
    grep -E "N=" "$OUT/before.log"
  fi
  python3 bench/decode.py --contexts 65536 --batches 1 8 --hlo --profile 65536:1 65536:8 \
    --out "$OUT/decode_after.json" "$@" > "$OUT/after.log" 2>&1 || rc=1
  grep -E "N=|x$" "$OUT/after.log"
  XLA_FLAGS="--xla_gpu_enable_command_buffer=" python3 bench/decode.py --contexts 65536 \
    --batches 1 8 --out "$OUT/decode_nocmdbuf.json" "$@" > "$OUT/nocmdbuf.log" 2>&1 || rc=1
  echo "command buffers off:"; grep -E "N=" "$OUT/nocmdbuf.log"
fi
if [[ $stage == grid || $stage == all ]]; then
  python3 bench/decode.py --out "$OUT/decode_h200.json" "$@" > "$OUT/grid.log" 2>&1 || rc=1
  sed -n '/^  N /,$p' "$OUT/grid.log"
fi
exit $rc
