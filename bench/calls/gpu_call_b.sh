#!/usr/bin/env bash
# One device call (issue 15, 2026-11-23 third session): 125M training tok/s with the fused
# block-major backward as the default, its tile sweep (bench/sel_block.py) and a kernel profile
# of the NSA op at 64k (bench/profile_op.py). Logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call_b}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/call_b.log"; rc=0
timeout 330 python3 bench/train_throughput.py --no-loader --points 65536:1 8192:4 2048:16 \
  --steps 8 --out "$OUT/train_throughput_h200x1.json" >> "$LOG" 2>&1 || rc=1
timeout 150 python3 bench/sel_block.py --shapes 125m --T 8192 65536 --reps 10 --variants \
  sel_dq_rows=32 sel_dq_rows=128 num_warps=2 num_warps=8 num_stages=3 \
  --out "$OUT/sel_block_sweep_h200.json" >> "$LOG" 2>&1 || rc=1
timeout 60 python3 bench/profile_op.py --T 65536 --top 14 --out "$OUT/profile_op_64k_h200.json" \
  > "$OUT/profile_op.txt" 2>> "$LOG" || rc=1
cat "$OUT/profile_op.txt"
python3 - "$OUT/sel_block_sweep_h200.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["T"], "query_bwd", r["query_bwd_ms"], {k[13:-1]: v for k, v in r.items()
                                                   if k.startswith("block_bwd_ms")},
          {k: v for k, v in r.items() if k.startswith("nsa_")})
PY
sed -n '/^model/,$p' "$LOG" | tail -n 10
exit $rc
