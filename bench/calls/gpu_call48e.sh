#!/usr/bin/env bash
# One device call (forty-eighth session, call 5): the local forward without its mask on full tiles. GPU tests of the
# local kernel and the chunked prefill; bench/chunk_tiles.py and the packed op's profile on the tree before ($1)
# and this one; then bench/chunked_prefill.py at 64k on this tree.
#   bash bench/calls/gpu_call48e.sh OLD_TREE
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
old=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout "${TEST_S:-170}" python3 -m pytest -m gpu -p no:cacheprovider -v -s -W ignore::DeprecationWarning -rfE \
  tests/test_chunked_prefill.py tests/test_pallas_gpu.py -k "chunked or dense_packed_pallas or (packed_bf16 and pallas-auto)" \
  >> "$log" 2>&1 || rc=1
echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
for tree in old new; do
  dir=.; [ "$tree" = old ] && dir=$old
  (cd "$dir" && timeout 60 env PYTHONPATH=. python3 bench/chunk_tiles.py --only-default \
     --out "$OUT/tiles_$tree.json") > "$OUT/tiles_$tree.log" 2>&1 || rc=1
  (cd "$dir" && timeout 80 env PYTHONPATH=. python3 bench/profile_op.py --T 65536 --packed-mean-doc 2048 --top 8 \
     --out "$OUT/op_$tree.json") > "$OUT/op_$tree.log" 2>&1 || rc=1
done
echo "  (A/B done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --lengths 65536 --chunks 4096 16384 \
  --reps 3 --out "$OUT/chunked.json" > "$OUT/chunked.log" 2>&1 || rc=1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$log" | tail -10
for tree in old new; do echo "== $tree"; tail -3 "$OUT/tiles_$tree.log"; grep -iE "busy|nsa_local_fwd" "$OUT/op_$tree.log" | head -4; done
tail -8 "$OUT/chunked.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
