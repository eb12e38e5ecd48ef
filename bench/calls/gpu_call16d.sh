#!/usr/bin/env bash
# One device call (sixteenth session): this tree (rowsum(O * dO) in the dQ kernel; the index sorted flat)
# against the tree before (.old/pre16 = b95b4d3, carried), each process started inside its tree with
# `python3 -P` (no working directory on sys.path), alternating: the selection backward, the dQ kernel alone
# and the NSA op fwd+bwd at the bench shape, 64k; the index sort variants; GPU parity of the gather path.
# (As run, the per-tree driver and the peers lines were inline here; they were moved unchanged into
# bench/ab_sel.py and bench/peers_run.sh afterwards.)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  PYTHONPATH=. timeout ${TEST_S:-200} python3 -m pytest -q -p no:xdist -m gpu -rfE \
    tests/test_pallas_gpu.py -k "bench-8192 or f32_matches or sel_dq_block_with_query" \
    > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
fi
timeout 120 python3 -P bench/index_sort.py --T 65536 > "$OUT/index_sort.log" 2>&1 || rc=1
grep -v "^\s*$" "$OUT/index_sort.log" | tail -11
for tree in .old/pre16 . .old/pre16 .; do
  (cd "$ROOT/$tree" && PYTHONPATH=.:bench timeout 150 python3 -P "$ROOT/bench/ab_sel.py" "$tree") \
    >> "$OUT/ab.log" 2>&1 || rc=1
done
grep -E "ms|Error|from" "$OUT/ab.log"
exit $rc
