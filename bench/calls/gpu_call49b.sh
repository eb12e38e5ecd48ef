#!/usr/bin/env bash
# One device call (forty-ninth session, call 2): the chunked-prefill GPU tests, then bench/chunked_prefill.py for
# nsa_125m at 64k, C = 4,096 and 16,384 (no prefill at once), in three processes: this tree (with a trace at C = 4,096),
# this tree with the query-major selection forward (the top-n change alone), and the tree before ($1).
#   bash bench/calls/gpu_call49b.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
gpu_tests tests/test_chunked_prefill.py
run() {  # name, extra args
  local name=$1; shift
  timeout "${BENCH_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
    --no-whole --reps 3 --out "$OUT/chunked_$name.json" "$@" > "$OUT/$name.log" 2>&1 || rc=1
  echo "  ($name done at $((SECONDS - t0)) s)" | tee -a "$log"
}
run new --chunks 16384 4096 --profile
run query --chunks 4096 16384 --set exec.kernel.sel_fwd=query
if [ -n "$old" ]; then   # this tree's bench script (--no-whole) over the tree before's package
  cp bench/chunked_prefill.py "$old/bench/chunked_prefill.py"
  (cd "$old" && timeout "${OLD_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --no-whole --chunks 4096 16384 --reps 3 --out "$OUT/chunked_old.json") > "$OUT/old.log" 2>&1 || rc=1
fi
grep -E "PASSED|FAILED|ERROR|passed|failed|bf16 relative" "$log" | tail -8
echo "== profile (new tree, C = 4,096)"; grep -A22 "== profile" "$OUT/new.log" | cut -c1-150
for n in old query new; do echo "== $n"; tail -4 "$OUT/$n.log" 2>/dev/null; done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
