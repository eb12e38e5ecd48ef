#!/usr/bin/env bash
# One device call (forty-ninth session, call 3): nsa_125m chunked prefill at 64k, C = 4,096 and 16,384, seven runs each,
# this tree (with a trace at C = 4,096) then the tree before ($1, with this tree's bench script), one process each.
#   bash bench/calls/gpu_call49c.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
timeout "${BENCH_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --no-whole --reps 7 --chunks 16384 4096 --profile --out "$OUT/chunked_new.json" > "$OUT/new.log" 2>&1 || rc=1
echo "  (new done at $((SECONDS - t0)) s)" | tee -a "$log"
if [ -n "$old" ]; then
  cp bench/chunked_prefill.py "$old/bench/chunked_prefill.py"
  (cd "$old" && timeout "${OLD_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --no-whole --reps 7 --chunks 16384 4096 --out "$OUT/chunked_old.json") > "$OUT/old.log" 2>&1 || rc=1
fi
echo "== profile (new tree, C = 4,096)"; grep -A16 "== profile" "$OUT/new.log" | cut -c1-150
for n in old new; do echo "== $n"; grep '"chunk"' "$OUT/$n.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['chunk'], round(r['ms'], 1), [round(t, 1) for t in r['times_ms']], 'compile', round(r['compile_s'], 1))"; done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
