#!/usr/bin/env bash
# One device call (fiftieth session, call 2): a continuation's top-n without the switch. The GPU tests of the top-n and
# the chunked prefill, then nsa_125m's chunked prefill at 64k, C = 16,384 and 4,096, seven runs, this tree (trace at
# C = 4,096) and the tree before ($1, with this tree's bench script), one process each.
#   bash bench/calls/gpu_call50b.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
TEST_S=${TEST_S:-150} gpu_tests tests/test_pallas_gpu.py::test_topn_upto_compiled_equals_semantics_64k_cache \
  "tests/test_chunked_prefill.py::test_gpu_chunked_prefill_with_pallas_first_chunk"
grep -E "passed|failed|PASSED|FAILED|Error" "$log" | tail -n 8
bench() {  # NAME DIR [extra]
  local name=$1 dir=$2; shift 2
  (cd "$dir" && timeout "${BENCH_S:-230}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --no-whole --reps 7 --chunks 16384 4096 --out "$OUT/chunked_$name.json" "$@") > "$OUT/$name.log" 2>&1
  local r=$?; echo "  ($name rc=$r at $((SECONDS - t0)) s)" | tee -a "$log"; return $r
}
bench new . --profile || rc=1
if [ -n "$old" ]; then cp bench/chunked_prefill.py "$old/bench/chunked_prefill.py"; bench old "$old" || rc=1; fi
echo "== profile (new tree, C = 4,096)"; grep -A14 "== profile" "$OUT/new.log" | cut -c1-140
chunked_table old new
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
