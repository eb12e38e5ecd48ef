#!/usr/bin/env bash
# One device call (thirteenth session): GPU tests of the query-tiled selection kernels; the selection
# forward/backward at the bench shape, T = 64k, before ($1: a tree without query tiles) and now with
# BlockSizes.sel_queries variants (bench/kernels.py --sweep, issue 15); the decode step at 128k/B=64
# with an XLA dump, its non-kernel ops named (bench/hlo_ops.py, issue 14). JSON and logs under $OUT.
set -u
OLD=$1
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "query_tiles" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
sweep() {  # $1 tree, $2 json, $3 python list of variants (sel_fwd and sel_bwd)
  (cd "$1" && PYTHONPATH=.:bench timeout 300 python3 -c "
import kernels as k
k.SWEEP = {'sel_fwd': $3, 'sel_bwd': $3}
k.main(['--shapes', 'bench', '--sweep', '65536', '--reps', '20', '--out', '$2'])")
}
sweep "$OLD" "$OUT/sweep_old.json" "[{}]" > "$OUT/sweep_old.log" 2>&1 || rc=1
sweep . "$OUT/sweep_new.json" "[{}, {'sel_queries': 2}, {'sel_queries': 2, 'sel_warps': 4},
  {'sel_queries': 4}, {'sel_queries': 4, 'sel_warps': 4}, {'sel_queries': 8, 'sel_warps': 4},
  {'sel_queries': 8, 'sel_warps': 8}]" > "$OUT/sweep_new.log" 2>&1 || rc=1
echo "== before"; grep -E "sel_(fwd|bwd) " "$OUT/sweep_old.log"
echo "== now"; grep -E "sel_(fwd|bwd) " "$OUT/sweep_new.log"
D=/tmp/dump_decode; rm -rf "$D"
XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*step_jit.*" \
  PYTHONPATH=. timeout 200 python3 bench/decode.py --models nsa_125m --contexts 131072 \
  --batches 64 --profile 131072:64 --out "$OUT/dec.json" > "$OUT/dec.log" 2>&1 || rc=1
ops=$(python3 - "$OUT/dec.json" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
p = next(p for p in d["points"] if p["model"] == "nsa_125m" and "profile" in p)
skip = re.compile(r"nsa_|gemm|cudnn|memcpy|triton", re.I)
print(" ".join(o["name"] for o in p["profile"]["top_ops"] if not skip.search(o["name"]))[:3000])
PY
)
PYTHONPATH=. python3 bench/hlo_ops.py "$D" --ops $ops > "$OUT/ops.txt" 2>&1 || rc=1
mod=$(ls -S "$D"/*after_optimizations.txt 2>/dev/null | head -1)
[[ -n "$mod" ]] && xz -6 -c "$mod" > "$OUT/step_nsa.hlo.xz"
grep -E "^nsa_125m|^ *131072" "$OUT/dec.log" | tail -n 2
grep -E "^(#|[a-z_0-9]+: |    meta)" "$OUT/ops.txt" | cut -c1-170 | head -40
exit $rc
