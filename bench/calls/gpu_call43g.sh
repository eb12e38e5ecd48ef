#!/usr/bin/env bash
# One device call (forty-third session, issue 14): call 8 again with the order alternated (after, before, after,
# before; one process each), since one process per tree left the loop time within the spread between processes.
#   bash bench/calls/gpu_call43g.sh BEFORE_TREE      (run from the after tree)
# (Its summary line moved into bench/decode_summary.py after the session's calls; the same output.)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
before=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for run in after1 before1 after2 before2; do
  tag=${run%?}; tree=.; [ "$tag" = before ] && tree=$before
  (cd "$tree" && PYTHONPATH=. timeout 100 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 \
    --batches 8 --reps 30 --models nsa_125m --profile 65536:8 --out "$OUT/decode_$run.json") > /dev/null 2>&1 || rc=1
  python3 bench/decode_summary.py "$OUT/decode_$run.json" "$run" | tee -a "$log"
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
