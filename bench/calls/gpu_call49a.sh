#!/usr/bin/env bash
# One device call (forty-ninth session, call 1): the chunked-prefill GPU tests (the continuation's block-major
# selection forward and narrow top-n), then bench/chunked_prefill.py for nsa_125m at 64k on this tree (C = 4,096 and
# 16,384, with a trace of the C = 16,384 prefill) and on the tree before the change (C = 16,384; passed as $1: a
# directory holding that tree's nsa_jax and bench), one process each.
#   bash bench/calls/gpu_call49a.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
gpu_tests tests/test_chunked_prefill.py
timeout "${BENCH_S:-280}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --chunks 4096 16384 --reps 3 --profile --out "$OUT/chunked_new.json" > "$OUT/new.log" 2>&1 || rc=1
echo "  (new tree done at $((SECONDS - t0)) s)" | tee -a "$log"
if [ -n "$old" ]; then
  (cd "$old" && timeout "${OLD_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --chunks 16384 --reps 3 --out "$OUT/chunked_old.json") > "$OUT/old.log" 2>&1 || rc=1
fi
grep -E "PASSED|FAILED|ERROR|passed|failed|bf16 relative" "$log" | tail -8
echo "== profile (new tree)"; grep -A22 "== profile" "$OUT/new.log" | cut -c1-150
echo "== old tree"; tail -8 "$OUT/old.log" 2>/dev/null
echo "== new tree"; tail -10 "$OUT/new.log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
