#!/usr/bin/env bash
# One device call (forty-second session, issue 15): two branch choices re-measured on an H200 at the 125M training
# points, one process per setting (bench/profile_op.py, device busy per fwd+bwd): the sliding window on the Mosaic GPU
# kernels (win_attn=mosaic; measured only on an H100, thirty-second session, before delta got a reduction of its own)
# and the compressed branch on the Pallas kernels at 8k (cmp_pallas_max_t=8192; last measured on an H100 in the
# twenty-fifth session, before the relaxed atomics of its split dK/dV). Defaults first and last at 2k and 8k.
#   bash bench/calls/gpu_call42b.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
op() {   # op TAG T B PROFILE_OP_ARGS...
  local tag=$1 T=$2 B=$3; shift 3
  ab_profile . "$tag" 90 bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 3 --top 40 \
    --out "$OUT/op_$tag.json" "$@"
}
op 2k_default1 2048 16
op 2k_winmosaic 2048 16 --choices win_attn=mosaic
op 8k_default1 8192 4
op 8k_winmosaic 8192 4 --choices win_attn=mosaic
op 8k_cmppallas 8192 4 --choices cmp_pallas_max_t=8192
op 64k_default 65536 1
op 64k_winmosaic 65536 1 --choices win_attn=mosaic
op 2k_default2 2048 16
op 8k_default2 8192 4
for p in 2k_default1:2k_winmosaic 8k_default1:8k_winmosaic 8k_default1:8k_cmppallas 64k_default:64k_winmosaic; do
  python3 bench/step_diff.py "$OUT/op_${p%%:*}.json" "$OUT/op_${p##*:}.json" 2>&1 | head -14 | tee -a "$log"
done
cd "$OUT" && tar czf ops.tgz op_*.json && rm -f op_*.json
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
