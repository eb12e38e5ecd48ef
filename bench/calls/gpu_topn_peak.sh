#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 fourth session): GPU parity of scoring/top-n and the op,
# top-n with forced blocks marked up front and width buckets (bench/score_topn.py) against the
# previous tree (.old/head, carried), the buffers live at the 64k train step's memory peak (XLA
# buffer-assignment dump, gzipped), and the 64k op's kernel profile. Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
LOG="$OUT/call.log"; rc=0
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE -s \
  -k "scores_and_selection or (bf16_matches and 125m and 8192) or packed_bf16" \
  >> "$LOG" 2>&1 || rc=1
PYTHONPATH=.old/head timeout 45 python3 bench/score_topn.py --T 8192 65536 \
  --out "$OUT/score_topn_before_h200.json" > "$OUT/before.txt" 2>> "$LOG" || rc=1
PYTHONPATH=. timeout 60 python3 bench/score_topn.py --T 8192 65536 --variants \
  "topn_warps=2 topn_elems=2048" "topn_warps=4 topn_elems=4096" \
  --out "$OUT/score_topn_h200.json" > "$OUT/after.txt" 2>> "$LOG" || rc=1
PYTHONPATH=. timeout 75 python3 bench/profile_op.py --T 65536 --top 14 \
  --out "$OUT/profile_op_64k_h200.json" > "$OUT/profile_op.txt" 2>> "$LOG" || rc=1
D=/tmp/xla_dump; rm -rf $D
PYTHONPATH=. XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text" timeout 170 \
  python3 bench/train_memory.py --points 65536:1 --variants "" >> "$LOG" 2>&1 || rc=1
f=$(ls -S $D/*buffer-assignment.txt 2>/dev/null | head -n 1)
[ -n "$f" ] && gzip -c "$f" > "$OUT/step_64k.buffer-assignment.txt.gz"
m=$(ls -S $D/*memory-usage-report.txt 2>/dev/null | head -n 1)
[ -n "$m" ] && gzip -c "$m" > "$OUT/step_64k.memory-usage-report.txt.gz"
ls -la $D | head -n 5; ls $D | wc -l
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 8
cat "$OUT/profile_op.txt"
echo "== before (HEAD tree)"; grep -v '^{' "$OUT/before.txt"
echo "== after"; grep -v '^{' "$OUT/after.txt"
grep compiled_peak "$LOG" | tail -n 2
exit $rc
