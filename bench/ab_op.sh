#!/usr/bin/env bash
# A same-call A/B of the NSA op (fwd+bwd, bench/profile_op.py) on one device call: this tree and the tree before (a
# `git archive` carried as an ignored folder, e.g. .old/sNN), one process each, alternating (after, before, after,
# before, ...) for ROUNDS rounds while the budget lasts (the bench shape at 64k took ~50 s per process on an H200,
# compile included: thirty-fifth session), then bench/step_diff.py on each round's pair, then, with the time left, the
# GPU tests named by -k.
#   bash bench/ab_op.sh BEFORE_TREE SHAPE:T:B [BUDGET_S] [ROUNDS] [PYTEST_K_EXPRESSION]
#   e.g. bash bench/ab_op.sh .old/s35 bench:65536:1 300 2 "test_cmp_attn_cudnn_matches_f32_reference"
# Writes $OUT/op_after1.json, op_before1.json, ..., diff1.json, ... and run.log.
set -u
. "$(dirname "$0")/ab_lib.sh"
[ $# -ge 2 ] || { echo "usage: bash bench/ab_op.sh BEFORE_TREE SHAPE:T:B [BUDGET_S] [ROUNDS] [PYTEST_K]" >&2; exit 2; }
before=$1; IFS=: read -r shape T B <<< "$2"; budget=${3:-300}; rounds=${4:-2}; kexpr=${5:-}
ab_check_tree ab_op "$before"
[ -n "$shape" ] && [ -n "$T" ] && [ -n "$B" ] || { echo "ab_op: point must be SHAPE:T:B, got $2" >&2; exit 2; }
case "$rounds" in ''|*[!0-9]*|0) echo "ab_op: ROUNDS must be a positive integer, got $rounds" >&2; exit 2;; esac
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
reserve=$([ -n "$kexpr" ] && echo 100 || echo 10)
per=$(( (budget - reserve) / (2 * rounds) ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | tee "$log"
for r in $(seq "$rounds"); do
  for tree in . "$before"; do
    tag=$([ "$tree" = . ] && echo after || echo before)$r
    ab_profile "$tree" "$tag" "$per" bench/profile_op.py --shape "$shape" --T "$T" --B "$B" --reps 3 --top 60 \
      --out "$OUT/op_$tag.json"
  done
  python3 bench/step_diff.py "$OUT/op_before$r.json" "$OUT/op_after$r.json" --json "$OUT/diff$r.json" 2>&1 \
    | head -24 | tee -a "$log" || rc=1
done
ab_gpu_tests "$kexpr"
exit $rc
