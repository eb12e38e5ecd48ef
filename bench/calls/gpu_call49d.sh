#!/usr/bin/env bash
# One device call (forty-ninth session, call 4): generate's decode-call memory check on the GPU: the CPU tests of
# tests/test_decode_memory.py run on the CUDA backend (its memory analysis), then bench/decode_memory.py for nsa_125m
# (B = 64, 2,048-token prompts, a 4,096-token cache, 16 steps per call).
#   bash bench/calls/gpu_call49d.sh
set -u
source bench/calls/call_lib.sh
call_start
timeout "${TEST_S:-130}" python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning -rfE \
  tests/test_decode_memory.py >> "$log" 2>&1 || rc=1
echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-100}" env PYTHONPATH=. python3 bench/decode_memory.py --model nsa_125m --batch 64 --prompt 2048 \
  --max-len 4096 --steps 16 --out "$OUT/decode_memory.json" >> "$log" 2>&1 || rc=1
grep -E "passed|failed|error" "$log" | tail -4
tail -14 "$log"
echo "done: $((SECONDS - t0)) s"
exit $rc
