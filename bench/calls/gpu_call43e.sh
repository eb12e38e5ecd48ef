#!/usr/bin/env bash
# One device call (forty-third session, issue 14): a fresh profile of the decode step and loop at 64k / B=8, NSA and
# dense in one process (bench/decode.py --profile), to list the kernels per token that the next change has to cut.
#   bash bench/calls/gpu_call43e.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; t0=$SECONDS
log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 400 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/decode_prof.json" > "$OUT/decode_prof.log" 2>&1 || rc=1
grep -E "N= *[0-9]+ B=|rror" "$OUT/decode_prof.log" | tail -6 | tee -a "$log"
python3 - "$OUT/decode_prof.json" <<'PY' | tee -a "$log"
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    lp = p.get("loop_profile")
    if not lp:
        continue
    print(f"{p['model']} N={p['context']} B={p['batch']}: loop busy {lp.get('device_busy_ms_per_step', 0):.3f} ms, "
          f"span {lp.get('device_span_ms_per_step', 0):.3f} ms, kernels per token {lp.get('n_kernels_per_step', 0):.1f}")
    for k in lp.get("top_kernels", [])[:16]:
        print(f"   {k['ms_per_step'] * 1e3:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")
PY
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
