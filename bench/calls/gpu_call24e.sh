#!/usr/bin/env bash
# One device call (twenty-fourth session, issue 15): the tiled selection kernels' row membership as bits
# (tiled_index.member_table). The op profiled (bench/profile_op.py, device busy per fwd+bwd) for the tree
# before ($1) and this tree, alternating: 125M 2k / B=16 (two rounds) and 4k / B=8 (one); then GPU parity of
# the tiled kernels and of the whole op at 2k (bf16 vs the float32 reference).
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
HERE=$(pwd); TMP=$(mktemp -d); LOG="$OUT/bench.log"
run() {  # tree tag T B
  local dir=$HERE; [[ $1 == before ]] && dir=$HERE/$OLD
  echo "== $1 $2 (t=${SECONDS}s)" >> "$LOG"
  (cd "$dir" && PYTHONPATH=. timeout 100 python3 bench/profile_op.py --shape 125m --T $3 --B $4 --reps 5 \
    --top 40 --out "$TMP/op_${2}_$1.json") >> "$LOG" 2>&1 || rc=1
}
for tree in before after; do run $tree 2k_r1 2048 16; done
for tree in before after; do run $tree 2k_r2 2048 16; done
for tree in before after; do run $tree 4k 4096 8; done
python3 bench/op_table.py "$TMP" "$OUT/ops.json" --op nsa_sel_tiled_fwd nsa_sel_tiled_bwd_dq \
  nsa_sel_tiled_bwd_dkv | tee -a "$LOG"
echo "ops done at ${SECONDS}s"
PYTHONPATH=. timeout $((560 - SECONDS)) python3 -m pytest -v -p no:xdist -m gpu -rfE tests/test_pallas_tiled.py \
  tests/test_pallas_gpu.py -k "tiled or (bf16_matches_f32_reference and 125m-2048)" > "$OUT/tests.log" 2>&1 || rc=1
grep -cE " PASSED" "$OUT/tests.log"; grep -E "passed|failed| FAILED|^(FAILED|ERROR)" "$OUT/tests.log"
grep -E "Error|Traceback" "$LOG" | head -5
exit $rc
