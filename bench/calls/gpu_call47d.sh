#!/usr/bin/env bash
# One device call (forty-seventh session, call 4): the training CLI on the GPU -- a tiny run, and an out-of-memory
# run (exit 4, one line, the new run directory removed) -- then generation with and without --prefill-chunk.
#   bash bench/calls/gpu_call47d.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
R=/tmp/nsa47; rm -rf "$R"; mkdir -p "$R"
timeout 200 python3 -m nsa_jax.train --config configs/tiny.yaml train.steps=4 train.ckpt_every=4 \
  train.eval_every=0 run.dir="$R/tiny" > "$R/tiny.out" 2>&1; echo "tiny train exit $?" | tee -a "$log"
tail -3 "$R/tiny.out" | cut -c1-300 | tee -a "$log"
timeout 240 python3 -m nsa_jax.train --config configs/nsa_125m.yaml data.source=synthetic data.path=null \
  data.seq_len=262144 train.batch_size=16 train.steps=2 train.eval_every=0 run.dir="$R/oom" > "$R/oom.out" 2>&1
echo "oom train exit $?; run dir left: $(ls -A "$R/oom" 2>&1 | tr '\n' ' ')" | tee -a "$log"
grep -v "^warning" "$R/oom.out" | tail -3 | cut -c1-900 | tee -a "$log"
P="The history of science and the history of water and the history of the people who lived by the river, and the rivers that ran to the sea, and the sea that ran to the sky, and the sky above the river"
timeout 120 python3 -m nsa_jax.generate --checkpoint "$R/tiny" --prompt "$P" --max-new-tokens 12 --temperature 0 \
  > "$R/g1.out" 2> "$R/g1.err"; echo "generate at once exit $?" | tee -a "$log"
timeout 120 python3 -m nsa_jax.generate --checkpoint "$R/tiny" --prompt "$P" --max-new-tokens 12 --temperature 0 \
  --prefill-chunk 32 > "$R/g2.out" 2> "$R/g2.err"; echo "generate chunked exit $?" | tee -a "$log"
cmp "$R/g1.out" "$R/g2.out" && echo "same text" | tee -a "$log" || { echo "TEXT DIFFERS" | tee -a "$log"; rc=1; }
grep prefill "$R/g1.err" "$R/g2.err" | cut -c1-250 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
