#!/usr/bin/env bash
# A same-call A/B of the train step on one device call: bench/profile_step.py for one point in this tree and in the
# tree before (a `git archive` carried as an ignored folder, e.g. .old/sNN), one process each, the time split evenly
# between them (one 125M point takes ~150 s on an H100 with compile and trace; two points in one process took 363 s),
# then bench/step_diff.py (busy, categories, the ops that moved), then, with the time left, the GPU tests named by -k.
#   bash bench/ab_step.sh BEFORE_TREE MODEL:T:B [BUDGET_S] [PYTEST_K_EXPRESSION]
#   e.g. bash bench/ab_step.sh .old/s34 nsa_125m:2048:16 560 "test_bf16_matches_f32_reference and 125m and 2048"
# Writes $OUT/step_after.json, step_before.json, diff.json and run.log.
set -u
. "$(dirname "$0")/ab_lib.sh"
[ $# -ge 2 ] || { echo "usage: bash bench/ab_step.sh BEFORE_TREE MODEL:T:B [BUDGET_S] [PYTEST_K]" >&2; exit 2; }
before=$1; IFS=: read -r model T B <<< "$2"; budget=${3:-560}; kexpr=${4:-}
ab_check_tree ab_step "$before"
[ -n "$model" ] && [ -n "$T" ] && [ -n "$B" ] || { echo "ab_step: point must be MODEL:T:B, got $2" >&2; exit 2; }
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; rc=0; log="$OUT/run.log"
reserve=$([ -n "$kexpr" ] && echo 120 || echo 10)
per=$(( (budget - reserve) / 2 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | tee "$log"
for tree in . "$before"; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  ab_profile "$tree" "$tag" "$per" bench/profile_step.py --models "$model" --points "$T:$B" --steps 2 --top 80 \
    --out "$OUT/step_$tag.json"
done
python3 bench/step_diff.py "$OUT/step_before.json" "$OUT/step_after.json" --json "$OUT/diff.json" 2>&1 \
  | head -40 | tee -a "$log" || rc=1
ab_gpu_tests "$kexpr"
exit $rc
