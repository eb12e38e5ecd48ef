#!/usr/bin/env bash
# Prepared in the fifty-second session for the next one (not yet run): the op as its own jitted function
# (`pallas.nsa._nsa_once`, `pallas.chunk._chunk_once`) against the tree before it (OLD, default `oldtree`: an archive
# of 8cadc27 or of the commit before the change). Per tree, one process each: nsa_125m's 64k prefill at C = 16,384 with
# an empty compile cache (its `compile_s`), then again reading that cache; `bench/lower_time.py` (the host's trace +
# lower alone); then `bench/train_throughput.py` at
# 8k / B=4 (NSA only; the step time must not move: XLA inlines the calls before it optimises).
#   bash bench/calls/gpu_call53b.sh [OLD]
set -u
source bench/calls/call_lib.sh
call_start
OLD=${1:-oldtree}
for tree in new old; do
  dir=.; [ $tree = old ] && dir=$OLD
  rm -rf "/tmp/cc53_$tree"
  for run in cold warm; do
    (cd "$dir" && timeout "${BENCH_S:-190}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
      --lengths 65536 --no-whole --reps 3 --chunks 16384 --compile-cache "/tmp/cc53_$tree" \
      --out "$OUT/chunked_${tree}_$run.json") > "$OUT/${tree}_$run.log" 2>&1 || rc=1
    echo "  ($tree $run at $((SECONDS - t0)) s)" | tee -a "$log"
  done
done
for tree in new old; do   # the host's share alone (bench/lower_time.py; the old tree runs this tree's copy of it)
  dir=.; [ $tree = old ] && { dir=$OLD; cp bench/lower_time.py "$OLD/bench/"; }
  (cd "$dir" && timeout 120 env PYTHONPATH=. python3 bench/lower_time.py --T 16384 --out "$OUT/lower_$tree.json") \
    >> "$log" 2>&1 || rc=1
done
for tree in new old; do
  dir=.; [ $tree = old ] && dir=$OLD
  (cd "$dir" && timeout "${TRAIN_S:-150}" env PYTHONPATH=. python3 bench/train_throughput.py --no-loader \
    --models nsa_125m --points 8192:4 --steps 8 --out "$OUT/train_$tree.json") > "$OUT/train_$tree.log" 2>&1 || rc=1
  echo "  (train $tree at $((SECONDS - t0)) s)" | tee -a "$log"
done
chunked_table new_cold new_warm old_cold old_warm
grep -h "nsa_125m" "$OUT"/train_*.log | tail -n 4
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
