#!/usr/bin/env bash
# One device call (fourteenth session): GPU parity of the forced-block split (KernelChoices.sel_forced =
# "tiled"); the selection forward / backward with it, bench shape T = 64k (bench/kernels.py --sweep,
# issue 15); one decode-loop call profiled at 128k/B=64 before ($1, without the φ skip) and now (busy
# time and device span per token, issue 14). JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
cp bench/decode.py bench/profile_step.py "$OLD/bench/"
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "forced_split" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
PYTHONPATH=.:bench timeout 240 python3 -c "
import kernels as k
v = [{}, {'sel_forced': 'tiled'}, {'sel_forced': 'tiled', 'sel_tile_q': 32},
     {'sel_forced': 'tiled', 'sel_tile_q': 128}, {}]
k.SWEEP = {'sel_fwd': v, 'sel_bwd': v}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$OUT/sweep.json'])" \
  > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(fwd|bwd) |FAILED" "$OUT/sweep.log"
for tree in "$OLD" .; do tag=$([[ $tree == . ]] && echo new || echo old)
  (cd "$tree" && PYTHONPATH=. timeout 110 python3 bench/decode.py --models nsa_125m --contexts 131072 \
    --batches 64 --reps 20 --profile 131072:64 --out "$OUT/dec_$tag.json" > "$OUT/dec_$tag.log" 2>&1) || rc=1
  echo "== $tag"; grep -E "^nsa_125m|loop profile" "$OUT/dec_$tag.log"
done
python3 - "$OUT/dec_old.json" "$OUT/dec_new.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
    p = next(p for p in json.load(open(f))["points"] if "loop_profile" in p)
    lp = p["loop_profile"]
    phi = {o["name"]: o["ms_per_step"] * 1e3 for o in lp["top_ops"] if "phi" in o["name"]}
    print(f.split("/")[-1], f"busy {lp['device_busy_ms_per_step']:.3f} span "
          f"{lp['device_span_ms_per_step']:.3f} ms/token, {lp['n_kernels_per_step']:.0f} kernels;",
          "phi us/token:", {k[:24]: round(v, 1) for k, v in phi.items()})
PY
exit $rc
