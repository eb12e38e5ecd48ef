#!/usr/bin/env bash
# One device call (seventeenth session): the 125M training table on this tree (NSA and dense in one process
# for all points: 64k B=1, 8k B=4, 2k B=16; the first version, one process per point, ran out of its 600 s
# after the first point), and the NSA step of the tree before the flat index sort
# (.old/pre17 = git archive of b95b4d3: nsa_jax, configs, bench/train_throughput.py; carried) at 64k and 8k,
# each process started inside its tree with `python3 -P`. As run (call 2), the 420 s and 170 s limits cut this
# tree's 2k pair and the tree before's 8k point; call 8 (gpu_call17e.sh) ran the 2k pair.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0; ROOT=$PWD
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d ' '); echo "device $dev"
run() {  # tree points models label timeout
  (cd "$ROOT/$1" && PYTHONPATH=. timeout "$5" python3 -P bench/train_throughput.py --no-loader \
     --points $2 --models $3 --steps 8 --out "$OUT/train_$4.json") 2>&1 \
     | while IFS= read -r line; do echo "$(date +%T) $line"; done >> "$OUT/train.log"
}
date +%T
run . "65536:1 8192:4 2048:16" "nsa_125m dense_125m" this 420; date +%T
run .old/pre17 "65536:1 8192:4" nsa_125m pre 170; date +%T
for f in "$OUT"/train_*.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["points"]:
    if "step_ms" in r:
        print("%-14s %10s T=%6d B=%2d %8.1f ms %10.0f tok/s peak %.3f GB" % (sys.argv[1].split("/")[-1],
              r["model"], r["seq_len"], r["batch"], r["step_ms"], r["tokens_per_s"],
              r.get("compiled_peak_gb") or 0))
PY
done
grep -c ERROR "$OUT/train.log"; exit 0
