#!/usr/bin/env bash
# One device call (issue 15/16, 2026-11-23 third session): GPU parity of the block-major selection
# kernels, bench/sel_block.py at the 125M shape, bench/packed.py with query- and block-major packed
# selection. Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call_a}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/call_a.log"; rc=0
timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py -rfE -s \
  -k "sel_fwd_block or (bf16_matches and 8192) or packed_bf16" >> "$LOG" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG" | tail -n 8
timeout 240 python3 bench/sel_block.py --shapes 125m --T 8192 65536 --reps 10 \
  --out "$OUT/sel_block_h200.json" >> "$LOG" 2>&1 || rc=1
timeout 150 python3 bench/packed.py --T 8192 65536 --reps 20 --attention nsa \
  --packed-sel auto block > "$OUT/packed.jsonl" 2>> "$LOG" || rc=1
grep speed "$OUT/packed.jsonl"
python3 - "$OUT/sel_block_h200.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["T"], {k: v for k, v in r.items() if k not in ("shape", "T")})
PY
exit $rc
