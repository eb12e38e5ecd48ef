#!/usr/bin/env bash
# One device call (thirty-fifth session, issue 15): the bench-shape op at 64k (bench/profile_op.py, device busy per
# fwd+bwd) in the tree before ($1, a `git archive` carried as .old/s35) and this one (the per-query selection dQ kernel
# reading the window's dQ and cuDNN's grouped compressed dQ as its accumulator's start), one process each, two rounds
# (after, before, after, before), then the first pair's top ops side by side, then the GPU parity tests of the grouped
# cuDNN compressed branch (bf16 against the float32 reference, with the gather selection's dQ kernels).
#   bash bench/calls/gpu_call35d.sh .old/s35
set -u
export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; t0=$SECONDS; log="$OUT/run.log"
base=${1:-.old/s35}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
for round in 1 2; do
  for tree in . "$base"; do
    tag=$([ "$tree" = . ] && echo after || echo before)$round
    (cd "$tree" && PYTHONPATH=. timeout 80 python3 -W ignore::DeprecationWarning bench/profile_op.py --shape bench \
      --T 65536 --reps 3 --top 40 --out "$OUT/op_$tag.json") 2>&1 | grep -E "busy|rror" | grep -v "^WARNING" \
      | sed "s/^/$tag /" | tee -a "$log"
    echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
  done
  [ $((SECONDS - t0)) -gt 150 ] && break
done
python3 - "$OUT/op_before1.json" "$OUT/op_after1.json" <<'PY' 2>&1 | tee -a "$log"
import json, sys
b, a = (json.load(open(f)) for f in sys.argv[1:3])
print(f"busy {b['device_busy_ms_per_step']:.2f} -> {a['device_busy_ms_per_step']:.2f} ms")
ops = lambda r: {o["name"][:60]: o["ms_per_step"] for o in r["top_ops"]}
ob, oa = ops(b), ops(a)
for n in sorted(set(ob) | set(oa), key=lambda n: -max(ob.get(n, 0), oa.get(n, 0)))[:16]:
    print(f"  {ob.get(n, float('nan')):8.3f} -> {oa.get(n, float('nan')):8.3f}  {n}")
PY
left=$((300 - (SECONDS - t0)))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -m gpu tests/test_pallas_gpu.py -p no:cacheprovider \
  -W ignore::DeprecationWarning -k "test_cmp_attn_cudnn_matches_f32_reference" 2>&1 \
  | grep -E "passed|failed|rror|assert" | tail -6 | tee -a "$log"
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
