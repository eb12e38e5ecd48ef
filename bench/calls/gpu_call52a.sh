#!/usr/bin/env bash
# Fifty-second session, call 1 (written in the fifty-first, extended here): (1) the compiled scores with the automatic
# key-range splits against the float32 reference (`test_scores_and_selection_f32`: at T = 2,048 the 125M loop layout
# has 64 programs, so 8 splits) and the grouped cuDNN chunk's GPU test (after the mend that reuses the scores'
# transposed keys); (2) nsa_125m's 64k prefill at C = 16,384 with the chunk's compressed attention on cuDNN ("auto")
# and on the Pallas kernel, one process each; (3) a profile of the 125M train step at 8k / B=4, NSA and dense
# (`bench/profile_step.py`), the first of that step since the twenty-second session's.
#   bash bench/calls/gpu_call52a.sh
set -u
source bench/calls/call_lib.sh
call_start
TEST_S=${TEST_S:-260} gpu_tests tests/test_pallas_gpu.py tests/test_chunk_cmp_grouped.py -k "scores_and_selection or cudnn_chunk"
for setting in auto pallas; do
  timeout "${BENCH_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
    --no-whole --reps 7 --chunks 16384 --set "exec.kernel.cmp_attn=$setting" --out "$OUT/chunked_$setting.json" \
    > "$OUT/$setting.log" 2>&1 || rc=1
  echo "  ($setting at $((SECONDS - t0)) s)" | tee -a "$log"
done
timeout "${PROF_S:-200}" env PYTHONPATH=. python3 bench/profile_step.py --models nsa_125m dense_125m \
  --points 8192:4 --steps 2 --top 40 --out "$OUT/profile_8k.json" > "$OUT/profile.log" 2>&1 || rc=1
echo "  (profile at $((SECONDS - t0)) s)" | tee -a "$log"
grep -E "PASS|FAIL|ERROR|passed|failed" "$log" | tail -n 8
chunked_table auto pallas
grep -E "busy|^nsa|^dense|==" "$OUT/profile.log" | head -20
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
