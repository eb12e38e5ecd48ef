#!/usr/bin/env bash
# One device call (seventeenth session): top-n by a two-phase threshold. GPU tests of the compiled top-n at 64k
# (and the scores/selection ones), then `bench/score_topn.py` for the tree before (.old/pre17t: nsa_jax of
# HEAD before the change, carried) and this tree, alternating, each process started with `python3 -P` and the
# tree first on PYTHONPATH (printed): 125M shape at 8k and 64k, bench shape at 64k.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "topn_compiled or scores_and_selection" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
for tree in .old/pre17t . .old/pre17t .; do
  tag=$([[ $tree == . ]] && echo this || echo before)
  for shape in 125m bench; do
    T=$([[ $shape == 125m ]] && echo "8192 65536" || echo "65536")
    PYTHONPATH=$tree:bench timeout 120 python3 -P -c "import nsa_jax; print('$tag', nsa_jax.__file__)" \
      >> "$OUT/score_topn.log" 2>&1
    PYTHONPATH=$tree:bench timeout 150 python3 -P bench/score_topn.py --shape $shape --T $T --reps 20 \
      >> "$OUT/score_topn.log" 2>&1 || rc=1
  done
done
grep -E "^(this|before) |^ *[0-9]+ default|Error" "$OUT/score_topn.log"
exit $rc
