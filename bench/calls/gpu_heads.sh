#!/usr/bin/env bash
# One device call (issue 15/16, 2026-11-23 sixth session): heads stacked per tile in the tiled
# selection and document-local kernels. GPU parity (bf16 vs float32) with 1 and 2 heads per tile,
# then the kernels timed per variant in one process. JSON under $OUT.
# (Record of the call that measured them: sel_tile_heads / win_heads were removed after it, see
# bench/NOTES.md "Heads of a group stacked per tile"; the variants other than "" no longer exist.)
set -u
OUT=${OUT:-/tmp/nsa_heads}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/heads.log"; rc=0
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_tiled.py tests/test_local.py \
  -rfE -s -k "tiled_selection_bf16 or local_bf16" >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 6
timeout 270 python3 bench/kernels.py --sel-impl tiled --shapes 125m --T 2048 4096 8192 \
  --tokens 32768 --reps 10 --tiled-vars "" "sel_tile_heads=2" "sel_tile_heads=2,num_warps=8" \
  --out "$OUT/sel_heads_h200.json" > "$OUT/sel_heads.log" 2>&1 || rc=1
timeout 120 python3 bench/window_tiles.py --T 65536 --reps 10 --variants "" "win_heads=2" \
  "win_heads=2,num_warps=8" > "$OUT/win_heads.jsonl" 2>> "$LOG" || rc=1
sed -n '/== all/,$p' "$OUT/sel_heads.log"
grep -v '"rows"' "$OUT/win_heads.jsonl"
exit $rc
