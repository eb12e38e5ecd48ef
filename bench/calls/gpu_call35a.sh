#!/usr/bin/env bash
# One device call (thirty-fifth session, issue 15): name the XLA glue of the bench-shape op at 64k (the compressed
# branch's grouped cuDNN path: its query grouping and ungrouping copies, and the three-branch dQ sum) and of the 125M
# 8k / B=4 train step (the same grouped path), each profiled with an XLA dump of the same process (bench/hlo_ops.py
# names every top fusion's HLO root and JAX source). Nothing is compared: this call only names what to change.
#   bash bench/calls/gpu_call35a.sh
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; t0=$SECONDS; log="$OUT/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
D=/tmp/dump_op; rm -rf "$D"
XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text" timeout 300 python3 -W ignore::DeprecationWarning \
  bench/profile_op.py --shape bench --T 65536 --reps 3 --top 60 --out "$OUT/op_bench64k.json" >> "$log" 2>&1
echo "=== bench op T=65536 B=1" > "$OUT/ops.txt"
python3 bench/hlo_ops.py "$D" --profile "$OUT/op_bench64k.json" --top 40 >> "$OUT/ops.txt" 2>> "$log"
mod=$(grep "^# module" "$OUT/ops.txt" | tail -1 | awk '{print $3}' | tr -d :)
[ -n "$mod" ] && xz -6 -c "$D/$mod" > "$OUT/op_bench64k.hlo.xz"
grep -E "busy" "$log" | tail -1
echo "  (op done at $((SECONDS - t0)) s)" | tee -a "$log"
left=$((590 - (SECONDS - t0)))
[ "$left" -gt 150 ] && OUT2="$OUT/step" && mkdir -p "$OUT2" && OUT="$OUT2" timeout "$left" bash bench/gpu_hlo.sh \
  "nsa_125m:8192:4" 2>&1 | grep -E "busy|^===|ms/step\)$" | head -3 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
grep -E "^===|^# module|ms/step\)$" "$OUT/ops.txt" | cut -c1-150 | head -40
