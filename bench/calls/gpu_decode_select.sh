#!/usr/bin/env bash
# One device call (nvidia-h200): the decode kernels' rank-count top-n and per-head finish
# (issue 14) before/after in the same call. The tree before is carried as ${BEFORE}
# (git archive of nsa_jax, bench, configs at the previous commit).
#   tests:   GPU decode tests of this tree
#   64k:     nsa before/after and dense at 64k, B = 1 and 8, with profiles
#   128k:    nsa before/after and dense at 128k, B = 64
#   kernels: the decode kernels alone (bench/decode_kernels.py), before and after, at 64k/B=1,
#            64k/B=8 and 128k/B=64, and 64k/B=8 with the previous split count (17)
# JSON under $OUT; the comparison table last.
set -u
OUT=${OUT:-/tmp/nsa_decode_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/decode.log"
HERE=$(pwd)
BEFORE=${BEFORE:-.old/pre_decode}   # the tree before (git archive of nsa_jax, bench, configs)
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$LOG"
PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_decode.py -rfE > "$OUT/tests.txt" 2>&1
tail -n 2 "$OUT/tests.txt"
for stage in "$@"; do
  case $stage in
    64k)
      (cd ${BEFORE} && PYTHONPATH=. python3 bench/decode.py --models nsa_125m \
        --contexts 65536 --batches 1 8 --profile 65536:1 65536:8 --out "$OUT/before_64k.json") >> "$LOG" 2>&1
      PYTHONPATH=. python3 bench/decode.py --contexts 65536 --batches 1 8 \
        --profile 65536:1 65536:8 --out "$OUT/after_64k.json" >> "$LOG" 2>&1 ;;
    128k)
      (cd ${BEFORE} && PYTHONPATH=. python3 bench/decode.py --models nsa_125m \
        --contexts 131072 --batches 64 --out "$OUT/before_128k.json") >> "$LOG" 2>&1
      PYTHONPATH=. python3 bench/decode.py --contexts 131072 --batches 64 \
        --out "$OUT/after_128k.json" >> "$LOG" 2>&1 ;;
    kernels)
      P="65536:1 65536:8 131072:64"
      PYTHONPATH=. python3 bench/decode_kernels.py --tree ${BEFORE} --points $P \
        --out "$OUT/k_before.json" >> "$LOG" 2>&1
      PYTHONPATH=. python3 bench/decode_kernels.py --points $P --out "$OUT/k_after.json" >> "$LOG" 2>&1
      PYTHONPATH=. python3 bench/decode_kernels.py --points 65536:8 --variants splits=17 \
        --out "$OUT/k_after_splits17.json" >> "$LOG" 2>&1 ;;
  esac
done
grep -E "failed|Error" "$LOG" | tail -n 5
cd "$HERE" && python3 bench/decode_compare.py "$OUT"/before_*.json "$OUT"/after_*.json --top 10
grep -E "N= *[0-9]+ B=" "$LOG"
