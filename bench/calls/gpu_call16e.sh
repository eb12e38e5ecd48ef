#!/usr/bin/env bash
# One device call (sixteenth session): this tree against itself without the rowsum change (.old/norow:
# cf4cd25 reverted on f6a2ecb, carried), one process each started inside its tree with `python3 -P`: the
# selection backward, the dQ kernel and the NSA op at the bench shape, 64k; then the peers table there
# (bench/peers.py; carry .whl with fla-core and .peers/xunhao) (issue 15).
# (As run, the per-tree driver and the peers lines were inline here; they were moved unchanged into
# bench/ab_sel.py and bench/peers_run.sh afterwards.)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for tree in ${TREES:-.old/norow .}; do
  (cd "$ROOT/$tree" && PYTHONPATH=.:bench timeout 150 python3 -P "$ROOT/bench/ab_sel.py" "$tree") \
    >> "$OUT/ab.log" 2>&1 || rc=1
done
grep -E "ms|Error|from" "$OUT/ab.log"
source bench/peers_run.sh
exit $rc
