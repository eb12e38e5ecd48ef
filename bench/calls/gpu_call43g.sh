#!/usr/bin/env bash
# One device call (forty-third session, issue 14): call 8 again with the order alternated (after, before, after,
# before; one process each), since one process per tree left the loop time within the spread between processes.
#   bash bench/calls/gpu_call43g.sh BEFORE_TREE      (run from the after tree)
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
before=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for run in after1 before1 after2 before2; do
  tag=${run%?}; tree=.; [ "$tag" = before ] && tree=$before
  (cd "$tree" && PYTHONPATH=. timeout 100 python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 \
    --batches 8 --reps 30 --models nsa_125m --profile 65536:8 --out "$OUT/decode_$run.json") > /dev/null 2>&1 || rc=1
  python3 - "$OUT/decode_$run.json" "$run" <<'PY' | tee -a "$log"
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    lp = p.get("loop_profile", {})
    cw = sum(k["ms_per_step"] for k in lp.get("top_kernels", []) if k["name"] == "nsa_cache_write")
    print(f"{sys.argv[2]:7s} {p['model']} N={p['context']} B={p['batch']}: loop {p.get('loop_ms', 0):.3f} ms, "
          f"step {p.get('step_ms', 0):.3f}, loop busy {lp.get('device_busy_ms_per_step', 0):.3f}, span "
          f"{lp.get('device_span_ms_per_step', 0):.3f}, nsa_cache_write {cw * 1e3:.1f} us per token")
PY
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
