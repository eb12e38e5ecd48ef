#!/usr/bin/env bash
# One device call (forty-eighth session, call 7): the local backward's unmasked full tiles. The packed bf16 GPU tests
# (values and gradients against float32), then the packed 125M op at 64k on the tree before ($1) and this one.
#   bash bench/calls/gpu_call48g.sh OLD_TREE
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
old=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TEST_S:-110}" python3 -m pytest -m gpu -p no:cacheprovider -v -W ignore::DeprecationWarning -rfE \
  tests/test_pallas_gpu.py -k "dense_packed_pallas or (packed_bf16 and pallas-auto)" >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
for tree in new old; do
  dir=.; [ "$tree" = old ] && dir=$old
  (cd "$dir" && timeout 45 env PYTHONPATH=. python3 bench/profile_op.py --T 65536 --packed-mean-doc 2048 --top 8 \
     --out "$OUT/op_$tree.json") > "$OUT/op_$tree.log" 2>&1 || rc=1
done
grep -E "PASSED|FAILED|ERROR|passed|failed" "$log" | tail -4
for tree in old new; do echo "== $tree"; grep -iE "busy|nsa_local" "$OUT/op_$tree.log" | head -4; done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
