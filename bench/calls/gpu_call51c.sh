#!/usr/bin/env bash
# One device call (fifty-first session, call 3): the scoring kernel's key-range splits. The GPU tests of the splits and
# of the chunked prefill; `bench/chunk_tiles.py --profile 10` with split counts 1/2/4/8 and the automatic one at
# (C, start) = (4,096, 61,440), (1,024, 64,512), (16,384, 49,152); then nsa_125m's 64k prefill at C = 4,096, this tree
# and the tree before ($1, with this tree's bench scripts), seven runs, one process each.
#   bash bench/calls/gpu_call51c.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
gpu_tests tests/test_score_splits.py tests/test_chunked_prefill.py
tiles() {  # NAME CHUNK START
  timeout "${TILES_S:-100}" env PYTHONPATH=. python3 bench/chunk_tiles.py --kinds nsa --chunk "$2" --start "$3" \
    --profile 10 --only default "score split1" "score split2" "score split4" "score split8" \
    --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1 || rc=1
  echo "  ($1 at $((SECONDS - t0)) s)" | tee -a "$log"
}
tiles c4096 4096 61440
tiles c1024 1024 64512
tiles c16384 16384 49152
prefill_bench new . || rc=1
if [ -n "$old" ]; then
  cp bench/chunked_prefill.py bench/profile_step.py "$old/bench/"; prefill_bench old "$old" || rc=1
fi
grep -E "PASS|FAIL|ERROR|passed|failed" "$log" | tail -n 8
for n in c4096 c1024 c16384; do
  echo "== $n"; grep -A 12 '^kind ' "$OUT/$n.log" | grep -E "^nsa|nsa_cmp_scores" | sed 's/, nsa_sel.*//'
done
chunked_table new old
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
