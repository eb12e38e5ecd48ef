#!/usr/bin/env bash
# One device call (forty-first session, issue 15): the block-major backward's dQ by relaxed atomic adds
# (KernelChoices.sel_dq_sum=atomic) against the per-slot partials (the default), one tree, one process each. First the
# GPU parity tests of the block-major kernels (capped at TESTS_S); then the 125M op at 8k / B=4 (two rounds) and 64k /
# B=1 (one), bench/profile_op.py.
#   bash bench/calls/gpu_call41a.sh
# Ran at commit 204d922. The choice was reverted after this call (bench/NOTES.md, forty-first session), so at later
# trees the atomic processes stop on an unknown KernelChoices field: the script is the record of what call 1 ran.
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"; rc=0
. bench/ab_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -W ignore::DeprecationWarning -rf \
  tests/test_pallas_gpu.py -k "sel_dq_atomic or sel_block_passes or (bf16_matches and 125m and 8192)" \
  > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -12 | tee -a "$log"
echo "tests done at $((SECONDS - t0)) s" | tee -a "$log"
op() {   # op TAG T B SECONDS [CHOICES...]
  local tag=$1 T=$2 B=$3 secs=$4; shift 4
  ab_profile . "$tag" "$secs" bench/profile_op.py --shape 125m --T "$T" --B "$B" --reps 3 --top 40 \
    --out "$OUT/op_$tag.json" ${1:+--choices "$@"}
}
opdiff() { python3 bench/step_diff.py "$OUT/op_$1.json" "$OUT/op_$2.json" 2>&1 | head -14 | tee -a "$log"; }
for r in 1 2; do
  op slots8k$r 8192 4 60; op atomic8k$r 8192 4 60 sel_dq_sum=atomic; opdiff slots8k$r atomic8k$r
done
op slots64k 65536 1 90; op atomic64k 65536 1 90 sel_dq_sum=atomic; opdiff slots64k atomic64k
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
