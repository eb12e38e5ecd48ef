#!/usr/bin/env bash
# One device call (fiftieth session, call 4): the cache built in one jitted call. nsa_125m chunked prefill at 64k,
# C = 4,096, seven runs, this tree and the tree before ($1, with this tree's bench scripts), one process each.
#   bash bench/calls/gpu_call50d.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
prefill_bench new . || rc=1
if [ -n "$old" ]; then
  cp bench/chunked_prefill.py bench/profile_step.py "$old/bench/"; prefill_bench old "$old" || rc=1
fi
chunked_table new old
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
