#!/usr/bin/env bash
# One device call (issue 15, eleventh session): the SwiGLU gate's custom VJP measured alone
# (bench/swiglu.py: autodiff vs custom VJP in one process) and in 125M training at one point, with
# the tree before (a copy of nsa_jax, configs and the bench script in
# OLD, carried) and after in the same call, NSA and dense in each
# process, one process per tree. Logs and JSON under $OUT.
# Usage: bash bench/calls/gpu_swiglu11.sh OLD_TREE [T:B] [per-run train timeout s] [OLD_TAG, default before]
#   call 1: .old/pre11 65536:1 200 (the tree before the custom VJP)
#   call 2: .old/flip 65536:1 200 flip (the select/reverse formulation of the backward)
#   call 8: .old/pre11c 65536:1 200 two_sigmoid (e7fd9ec vs one sigmoid per element)
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
OLD=${1:?old tree}; POINT=${2:-65536:1}; LIMIT=${3:-170}; OTAG=${4:-before}; LOG="$OUT/call.log"; rc=0
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d ' ')
echo "device $dev"
hbm=4.3; case "$dev" in *H100*) hbm=3.35;; esac
PYTHONPATH=. timeout 120 python3 bench/swiglu.py --tokens 65536 32768 --hbm-tbs $hbm \
  --out "$OUT/swiglu_$dev.json" > "$OUT/swiglu.txt" 2>> "$LOG" || rc=1
p=$(echo "$POINT" | tr : x)
HERE=$PWD
for tag in "$OTAG" after; do
  dir=$HERE; [ "$tag" = "$OTAG" ] && dir=$HERE/$OLD
  (cd "$dir" && PYTHONPATH=. timeout "$LIMIT" python3 bench/train_throughput.py --no-loader \
    --points "$POINT" --steps 8 --out "$OUT/train_${dev}_${p}_$tag.json") \
    >> "$OUT/train_$tag.log" 2>&1 || rc=1
done
echo "== swiglu"; grep -v '^{' "$OUT/swiglu.txt"
for tag in "$OTAG" after; do
  echo "== train $POINT $tag"; grep -E '^\{' "$OUT/train_$tag.log" | python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    print("%10s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (r["model"], r["seq_len"],
          r["batch"], r["step_ms"], r["tokens_per_s"], r.get("compiled_peak_gb") or 0))'
done
exit $rc
