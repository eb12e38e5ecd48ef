#!/usr/bin/env bash
# One device call (fiftieth session, call 1): where a chunked prefill's span above its device time goes at small
# chunks. nsa_125m, 64k prompt, C = 4,096, seven runs, one process per XLA command-buffer setting:
#   default; + CONDITIONAL (the top-n width's lax.switch recorded in the CUDA graph, no host read of its index);
#   command buffers off. `dispatch_ms` (bench/chunked_prefill.py) is the time until Decoder.prefill returns.
#   bash bench/calls/gpu_call50a.sh
set -u
source bench/calls/call_lib.sh
call_start
run() {  # NAME XLA_FLAGS [extra args]
  local name=$1 flags=$2; shift 2
  timeout "${BENCH_S:-150}" env PYTHONPATH=. XLA_FLAGS="$flags" python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --no-whole --reps 7 --chunks 4096 --out "$OUT/chunked_$name.json" "$@" > "$OUT/$name.log" 2>&1
  local r=$?; echo "  ($name rc=$r at $((SECONDS - t0)) s)" | tee -a "$log"; return $r
}
run default "" --profile || rc=1
run cond "--xla_gpu_enable_command_buffer=+CONDITIONAL" --profile \
  || run cond "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL" --profile || rc=1
run off "--xla_gpu_enable_command_buffer=" || rc=1
for n in default cond off; do
  echo "== $n"; grep -B2 -A12 "== profile" "$OUT/$n.log" | cut -c1-140
  chunked_table "$n"
  tail -n 3 "$OUT/$n.log" | cut -c1-200
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
