#!/usr/bin/env bash
# A device call prepared in the fifty-first session for the next one (not yet run): (1) the compiled scores with the
# automatic key-range splits against the float32 reference (`test_scores_and_selection_f32`: at T = 2,048 the 125M loop
# layout has 64 programs, so 8 splits) and the grouped cuDNN chunk's GPU test; (2) nsa_125m's 64k prefill at
# C = 16,384 with the chunk's compressed attention on cuDNN ("auto") and on the Pallas kernel, one process each.
#   bash bench/calls/gpu_call52a.sh
set -u
source bench/calls/call_lib.sh
call_start
gpu_tests tests/test_pallas_gpu.py tests/test_chunk_cmp_grouped.py -k "scores_and_selection or cudnn_chunk"
for setting in auto pallas; do
  timeout "${BENCH_S:-240}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
    --no-whole --reps 7 --chunks 16384 --set "exec.kernel.cmp_attn=$setting" --out "$OUT/chunked_$setting.json" \
    > "$OUT/$setting.log" 2>&1 || rc=1
  echo "  ($setting at $((SECONDS - t0)) s)" | tee -a "$log"
done
grep -E "PASS|FAIL|ERROR|passed|failed" "$log" | tail -n 8
chunked_table auto pallas
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
