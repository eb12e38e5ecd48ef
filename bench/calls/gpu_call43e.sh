#!/usr/bin/env bash
# One device call (forty-third session, issue 14): a fresh profile of the decode step and loop at 64k / B=8, NSA and
# dense in one process (bench/decode.py --profile), to list the kernels per token that the next change has to cut.
#   bash bench/calls/gpu_call43e.sh
# (Its summary moved into bench/decode_summary.py --top after the session's call; the same numbers.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; t0=$SECONDS
log="$OUT/run.log"; rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout 400 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 8 --reps 30 \
  --profile 65536:8 --out "$OUT/decode_prof.json" > "$OUT/decode_prof.log" 2>&1 || rc=1
grep -E "N= *[0-9]+ B=|rror" "$OUT/decode_prof.log" | tail -6 | tee -a "$log"
python3 bench/decode_summary.py "$OUT/decode_prof.json" prof --top 16 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
