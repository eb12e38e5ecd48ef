#!/usr/bin/env bash
# Decode checks and benchmarks on the device machine, from the repo root:
#   bench/decode_gpu.sh STAGE... (stages run in the order given)
# tests:    GPU decode tests (tests/test_decode.py -m gpu).
# before:   the decode step of commit 3f3b251 (carried as .old/before.tar) at 64k, B = 1 and 8.
# profile:  this tree at 64k, B = 1 and 8: HLO in-place check (HLO text in $OUT/hlo.tgz) and
#           jax.profiler summaries.
# nocmdbuf: 64k, B = 1 and 8 with XLA command buffers (CUDA graphs) off.
# grid:     bench/decode.py over contexts 8k-128k x batches 1-64 for both models.
# Everything is logged to $OUT/decode.log; JSON per stage under $OUT. Short tables last.
set -u
OUT=${OUT:-/tmp/nsa_decode_out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/decode.log"
rc=0
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$LOG"
for stage in "$@"; do
  echo "== $stage" | tee -a "$LOG"
  case $stage in
    tests)
      python3 -m pytest -q -m gpu tests/test_decode.py -rfE >> "$LOG" 2>&1 || rc=1
      tail -n 2 "$LOG" ;;
    before)
      mkdir -p /tmp/before && tar -xf .old/before.tar -C /tmp/before
      (cd /tmp/before && PYTHONPATH=. python3 bench/decode.py --contexts 65536 --batches 1 8 \
        --reps 30 --out "$OUT/decode_before.json" >> "$LOG" 2>&1) || rc=1 ;;
    profile)
      mkdir -p /tmp/hlo
      python3 bench/decode.py --contexts 65536 --batches 1 8 --hlo --hlo-dump /tmp/hlo \
        --profile 65536:1 65536:8 --out "$OUT/decode_profile.json" >> "$LOG" 2>&1 || rc=1
      tar -czf "$OUT/hlo.tgz" -C /tmp hlo ;;
    nocmdbuf)
      XLA_FLAGS="--xla_gpu_enable_command_buffer=" python3 bench/decode.py --contexts 65536 \
        --batches 1 8 --out "$OUT/decode_nocmdbuf.json" >> "$LOG" 2>&1 || rc=1 ;;
    grid)
      python3 bench/decode.py --out "$OUT/decode_h200.json" >> "$LOG" 2>&1 || rc=1 ;;
  esac
  grep -E "N=.*(step|failed)|^ +[0-9]+ +[0-9]+ .*x$|passed|failed" "$LOG" | tail -n 40 > /tmp/tail.txt
done
cat /tmp/tail.txt
exit $rc
