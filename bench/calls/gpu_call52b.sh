#!/usr/bin/env bash
# Fifty-second session, call 4: JAX's persistent compilation cache (`nsa_jax.compile_cache`) on the GPU. nsa_125m's
# 64k prefill at C = 16,384 (`bench/chunked_prefill.py --compile-cache`) in two processes, the second reading what the
# first wrote; then, if time is left, the 125M train CLI at 8k / B=4 (3 steps, synthetic tokens) twice with
# `exec.compile_cache`. compile_s and the CLI's "with start-up and compilation" line are the numbers.
#   bash bench/calls/gpu_call52b.sh
set -u
source bench/calls/call_lib.sh
call_start
CC=/tmp/nsa_cc52; rm -rf "$CC"
for run in cold warm; do
  timeout "${BENCH_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
    --no-whole --reps 3 --chunks 16384 --compile-cache "$CC" --out "$OUT/chunked_$run.json" > "$OUT/$run.log" 2>&1 || rc=1
  echo "  (prefill $run at $((SECONDS - t0)) s; cache $(du -sm "$CC" | cut -f1) MB)" | tee -a "$log"
done
for run in cold warm; do
  [ $((SECONDS - t0)) -gt "${TRAIN_AFTER_S:-330}" ] && { echo "  (train $run skipped)" | tee -a "$log"; continue; }
  [ $run = cold ] && rm -rf /tmp/nsa_cc52t
  timeout 110 python3 -m nsa_jax.train --config configs/nsa_125m.yaml data.source=synthetic data.path=null \
    data.seq_len=8192 train.batch_size=4 train.steps=3 train.eval_every=0 train.ckpt_every=0 \
    run.dir=/tmp/nsa_run52_$run exec.compile_cache=/tmp/nsa_cc52t > "$OUT/train_$run.log" 2>&1 || rc=1
  echo "  (train $run at $((SECONDS - t0)) s)" | tee -a "$log"
done
chunked_table cold warm
grep -h "^done:" "$OUT"/train_*.log
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
