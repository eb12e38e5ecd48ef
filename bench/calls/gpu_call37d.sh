#!/usr/bin/env bash
# One device call (thirty-seventh session, issue 15): the block-major kernels' work-item size and pipeline stages after
# their loops got shorter. bench/profile_op.py at the 125M shape, 8k / B=4, one process per setting: the defaults,
# sel_chunk 256 / 512 / 2048 (queries per work item; 1024 by default), num_stages 1; then 64k / B=1 for the defaults
# and sel_chunk 256 / 512 while time lasts.
#   bash bench/calls/gpu_call37d.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
budget=${BUDGET_S:-330}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TAG T B [TILES...]
  local tag=$1 T=$2 B=$3; shift 3
  ab_profile . "$tag" 80 bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 3 --top 40 --out "$OUT/op_$tag.json" \
    ${1:+--tiles "$@"}
  python3 - "$OUT/op_$tag.json" <<'PY' | tee -a "$log"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(0)
ks = {k["name"]: k["ms_per_step"] for k in d["top_kernels"]}
print("   block fwd %.3f  block bwd %.3f  merge+sums %.3f" % (ks.get("nsa_sel_fwd_block", 0), ks.get("nsa_sel_bwd_block", 0),
      ks.get("loop_reduce_fusion", 0) + ks.get("loop_convert_fusion", 0)))
PY
}
op default 8192 4
op chunk256 8192 4 sel_chunk=256
op chunk512 8192 4 sel_chunk=512
op chunk2048 8192 4 sel_chunk=2048
op stages1 8192 4 num_stages=1
for c in default chunk256 chunk512; do
  [ $((SECONDS - t0)) -gt $((budget - 60)) ] && break
  case $c in default) op 64k_$c 65536 1;; *) op 64k_$c 65536 1 sel_chunk=${c#chunk};; esac
done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
