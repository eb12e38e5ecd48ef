#!/usr/bin/env bash
# One device call (twenty-third session, issue 15): dK/dV with keys as rows (s^T = K Q^T) in the document-local
# and the Pallas compressed kernels. The op with packed rows (mean document 2048) profiled for the tree before ($1)
# and this tree, alternating, two rounds, at 125M 64k / B=1 and 8k / B=4; then GPU parity of the packed paths.
# Logs in one file.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
for round in 1 2; do
  for p in "125m 65536 1" "125m 8192 4"; do set -- $p
    for tree in before after; do
      dir=$HERE; [[ $tree == before ]] && dir=$HERE/$OLD
      echo "== $tree $1 $2 $3 packed round $round (t=${SECONDS}s)" >> "$LOG"
      (cd "$dir" && PYTHONPATH=. timeout 110 python3 bench/profile_op.py --shape $1 --T $2 --B $3 --reps 5 \
        --packed-mean-doc 2048 --top 40 --out "$TMP/op_${1}_$2_${tree}_r$round.json") >> "$LOG" 2>&1 || rc=1
    done
  done
done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_local_bwd_dkv nsa_cmp_bwd_dkv_split nsa_local_fwd \
  | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "packed and not cudnn_matches" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
