#!/usr/bin/env bash
# One device call (twenty-first session, issue 14): is XLA's programmatic dependent launch (PDL,
# --xla_gpu_enable_pdl) on by default in this jax, and what does it do to the decode step? 64k / B=8, NSA and dense,
# one process per mode (XLA_FLAGS unset / pdl false / pdl true), the 16-token loop profiled; griddepcontrol
# instructions counted in the PTX that XLA dumps. Logs in one file (the device returns at most 8 files).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)"
LOG="$OUT/bench.log"
for mode in default false true; do
  F=""; [[ $mode != default ]] && F="--xla_gpu_enable_pdl=$mode"
  echo "== pdl $mode" >> "$LOG"
  XLA_FLAGS="$F --xla_dump_to=/tmp/dump_$mode" PYTHONPATH=. timeout 170 python3 bench/decode.py \
    --contexts 65536 --batches 8 --reps 30 --profile 65536:8 --out "$OUT/pdl_$mode.json" >> "$LOG" 2>&1 || rc=1
  n=$(cat /tmp/dump_$mode/*.ptx 2>/dev/null | grep -c griddepcontrol)
  echo "pdl $mode: griddepcontrol lines in the dumped PTX: $n ($(ls /tmp/dump_$mode/*.ptx 2>/dev/null | wc -l) files)" \
    | tee -a "$LOG"
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print(f"{'mode':>8} {'model':>10} {'loop ms':>8} {'busy ms':>8} {'span ms':>8} {'kernels':>8}")
for mode in ("default", "false", "true"):
    f = f"{out}/pdl_{mode}.json"
    if not os.path.exists(f): print(mode, "missing"); continue
    for p in json.load(open(f))["points"]:
        lp = p.get("loop_profile") or {}
        print(f"{mode:>8} {p['model']:>10} {p.get('loop_ms', 0):8.3f} {lp.get('device_busy_ms_per_step', 0):8.3f} "
              f"{lp.get('device_span_ms_per_step', 0):8.3f} {lp.get('n_kernels_per_step', 0):8.1f}")
PY
grep -E "failed|Error" "$LOG" | head -5
exit $rc
