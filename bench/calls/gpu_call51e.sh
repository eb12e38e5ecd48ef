#!/usr/bin/env bash
# One device call (fifty-first session, call 5): the compiled scores against the reference at T = 2,048 (the 125M
# loop layout there has 64 programs, so the automatic key-range splits run: 8), the top-n GPU tests, and an early
# continuation chunk (C = 4,096 at 4,096: part A of the grouped cuDNN path sees 254 of the cache's 4,100 compressed
# keys) on cuDNN and on the Pallas kernel, whether cuDNN skips the key tiles past the sequence length.
#   bash bench/calls/gpu_call51e.sh
set -u
source bench/calls/call_lib.sh
call_start
gpu_tests tests/test_pallas_gpu.py -k "scores_and_selection or topn"
timeout "${TILES_S:-100}" env PYTHONPATH=. python3 bench/chunk_tiles.py --kinds nsa --chunk 4096 --start 4096 \
  --profile 10 --only default "cmp pallas" --out "$OUT/c4096_early.json" > "$OUT/c4096_early.log" 2>&1 || rc=1
grep -E "PASS|FAIL|ERROR|passed|failed" "$log" | tail -n 10
grep -A 8 '^kind ' "$OUT/c4096_early.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
