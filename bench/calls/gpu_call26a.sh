#!/usr/bin/env bash
# One device call (twenty-sixth session, issues 14 and 15): (1) the Pallas decode kernels at 128k, B=8 and B=1,
# per variant of the compressed kernel's keys per program (splits, cmp_keys), warps (cmp_warps) and the scoring
# chunk (sel_chunk), bench/decode_kernels.py, all variants in one process per point; (2) Nsight Compute on
# nsa_decode_cmp at 128k / B=8, today's 32 splits and 128; (3) the tournament top-n's rows per program at 125M 64k
# (bench/score_topn.py; tour_min_width is its bench-only key for the narrowest tournament bucket).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
V128="default splits=64 splits=128 cmp_warps=4 cmp_warps=1 splits=128,cmp_warps=4 cmp_keys=128,splits=64
  cmp_keys=32,splits=128 sel_chunk=64 sel_chunk=32 splits=128,sel_chunk=64"
PYTHONPATH=. timeout 200 python3 bench/decode_kernels.py --points 131072:8 131072:1 --variants $V128 \
  --out "$OUT/decode_128k.json" > "$OUT/decode.log" 2>&1 || rc=1
echo "decode 128k done at ${SECONDS}s"
PYTHONPATH=. timeout 80 python3 bench/decode_kernels.py --points 65536:8 --variants default splits=64 \
  splits=64,sel_chunk=32 --out "$OUT/decode_64k.json" >> "$OUT/decode.log" 2>&1 || rc=1
PYTHONPATH=. timeout 60 python3 bench/decode_kernels.py --points 8192:8 --variants default \
  --out "$OUT/decode_8k.json" >> "$OUT/decode.log" 2>&1 || rc=1
echo "decode done at ${SECONDS}s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
LOG="$OUT/ncu.log"; : > "$LOG"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats"
for var in default splits=128; do
  echo "===== nsa_decode_cmp 128k/B=8 $var (t=${SECONDS}s)" >> "$LOG"
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. timeout 120 "$NCU" --clock-control none \
    -k regex:nsa_decode_cmp --launch-skip 12 -c 1 $SECTIONS --print-details all \
    python3 bench/decode_kernels.py --points 131072:8 --variants "$var" --warm-only >> "$LOG" 2>&1 || rc=1
done
echo "ncu done at ${SECONDS}s"
PYTHONPATH=. timeout $((560 - SECONDS)) python3 bench/score_topn.py --T 65536 --reps 20 --variants \
  "topn_tour_rows=1" "tour_min_width=256 topn_tour_rows=1" "tour_min_width=256 topn_tour_rows=2" \
  --out "$OUT/topn_64k.json" > "$OUT/topn.log" 2>&1 || rc=1
echo "topn done at ${SECONDS}s"
grep -E "^=====|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|No Eligible|Waves Per SM|Grid Size|Block Size" \
  "$LOG" | sed -E 's/ +/ /g' | cut -c1-120 | head -40
grep -E "us/layer|ran twice|Error|Traceback" "$OUT/decode.log" | cut -c1-230
grep -E "^ *[0-9]+ " "$OUT/topn.log" | tail -5
exit $rc
