#!/usr/bin/env bash
# One device call (issue 15, seventh session): name the XLA glue of the 125M train step. For each
# point, profile the step with an XLA dump of the same process, then print every top non-kernel
# op's optimized-HLO instruction and JAX source (bench/hlo_ops.py). The step's optimized HLO comes
# back xz-compressed (8 files: log, ops.txt, a profile and a module per point; three points). Usage: bash bench/gpu_hlo.sh ["nsa_125m:8192:4 nsa_125m:2048:16 ..."]
set -u
OUT=${OUT:-/tmp/nsa_hlo}; mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
POINTS=${1:-"nsa_125m:8192:4 nsa_125m:2048:16 dense_125m:8192:4"}
LOG="$OUT/hlo.log"; rc=0
for p in $POINTS; do IFS=: read -r model T B <<< "$p"
  D=/tmp/dump_${model}_$T; rm -rf "$D"
  XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text" timeout 240 python3 bench/profile_step.py \
    --models "$model" --points "$T:$B" --steps 2 --top 80 --out "$OUT/prof_${model}_$T.json" >> "$LOG" 2>&1 || rc=1
  echo "=== $model T=$T B=$B" >> "$OUT/ops.txt"
  python3 bench/hlo_ops.py "$D" --profile "$OUT/prof_${model}_$T.json" --top 45 \
    >> "$OUT/ops.txt" 2>> "$LOG" || rc=1
  mod=$(grep "^# module" "$OUT/ops.txt" | tail -1 | awk '{print $3}' | tr -d :)
  xz -6 -c "$D/$mod" > "$OUT/step_${model}_$T.hlo.xz"
done
tail -n 3 "$LOG"
grep -E "^===|^# module|ms/step\)$" "$OUT/ops.txt" | cut -c1-160 | head -90
exit $rc
