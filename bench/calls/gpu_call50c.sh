#!/usr/bin/env bash
# One device call (fiftieth session, call 3): where the host's ~10 ms per continuation call go. nsa_125m, 64k prompt,
# C = 4,096, seven runs and a trace with the host threads' events, one process each: this tree (XLA's default), this
# tree with command buffers off, the tree before ($1, with this tree's bench scripts).
#   bash bench/calls/gpu_call50c.sh [OLD_TREE]
set -u
source bench/calls/call_lib.sh
old=${1:-}
call_start
bench() {  # NAME DIR XLA_FLAGS
  local name=$1 dir=$2 flags=$3
  (cd "$dir" && timeout "${BENCH_S:-150}" env PYTHONPATH=. XLA_FLAGS="$flags" python3 bench/chunked_prefill.py \
    --models nsa_125m --lengths 65536 --no-whole --reps 7 --chunks 4096 --profile --out "$OUT/chunked_$name.json") \
    > "$OUT/$name.log" 2>&1
  local r=$?; echo "  ($name rc=$r at $((SECONDS - t0)) s)" | tee -a "$log"; return $r
}
bench new . "" || rc=1
bench new_off . "--xla_gpu_enable_command_buffer=" || rc=1
if [ -n "$old" ]; then
  cp bench/chunked_prefill.py bench/profile_step.py "$old/bench/"; bench old "$old" "" || rc=1
fi
for n in new new_off old; do
  echo "== $n"; grep -A26 "== host events" "$OUT/$n.log" | grep -v '\$' | cut -c1-150 | head -14
  grep "== profile" "$OUT/$n.log"
  chunked_table "$n"
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
