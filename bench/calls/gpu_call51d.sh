#!/usr/bin/env bash
# One device call (fifty-first session, call 4): a continuation chunk's compressed attention on cuDNN in the grouped
# layout (`cmp_grouped.cmp_chunk_grouped`, "auto" for caches > cmp_pallas_max_t). Its GPU test; `bench/chunk_tiles.py
# --profile 10` with "auto" (cuDNN) and "cmp pallas" at (C, start) = (4,096, 61,440), (1,024, 64,512), (16,384,
# 49,152); nsa_125m's 64k prefill at once and at C = 4,096 (auto), then C = 4,096 with `exec.kernel.cmp_attn=pallas`,
# one process each, seven runs.
#   bash bench/calls/gpu_call51d.sh
set -u
source bench/calls/call_lib.sh
call_start
gpu_tests tests/test_chunk_cmp_grouped.py
tiles() {  # NAME CHUNK START
  timeout "${TILES_S:-100}" env PYTHONPATH=. python3 bench/chunk_tiles.py --kinds nsa --chunk "$2" --start "$3" \
    --profile 10 --only default "cmp pallas" --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1 || rc=1
  echo "  ($1 at $((SECONDS - t0)) s)" | tee -a "$log"
}
tiles c4096 4096 61440
tiles c1024 1024 64512
tiles c16384 16384 49152
timeout "${BENCH_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --reps 7 --chunks 4096 --out "$OUT/chunked_auto.json" > "$OUT/auto.log" 2>&1 || rc=1
echo "  (auto at $((SECONDS - t0)) s)" | tee -a "$log"
timeout "${BENCH_S:-200}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --no-whole --reps 7 --chunks 4096 --set exec.kernel.cmp_attn=pallas --out "$OUT/chunked_pallas.json" \
  > "$OUT/pallas.log" 2>&1 || rc=1
echo "  (pallas at $((SECONDS - t0)) s)" | tee -a "$log"
grep -E "PASS|FAIL|ERROR|passed|failed|rel RMSE" "$log" | tail -n 6
for n in c4096 c1024 c16384; do echo "== $n"; grep -A 8 '^kind ' "$OUT/$n.log"; done
chunked_table auto pallas
grep -h '"rel_rmse"' "$OUT"/auto.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print('chunk', r['chunk'], 'rel_rmse', r['rel_rmse'])"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
