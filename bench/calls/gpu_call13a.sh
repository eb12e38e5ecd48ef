#!/usr/bin/env bash
# One device call (thirteenth session): the GPU tests of the query-tiled selection kernels; the
# selection forward/backward sweep at the bench shape, T = 64k (bench/kernels.py --sweep, incl.
# BlockSizes.sel_queries, issue 15); the decode step at 128k/B=64 with an XLA dump, its non-kernel
# ops named (bench/hlo_ops.py, issue 14). JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_pallas_gpu.py \
  -k "query_tiles" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
timeout 300 python3 bench/kernels.py --shapes bench --sweep 65536 --groups sel_fwd sel_bwd \
  --reps 20 --out "$OUT/sweep_bench64k.json" > "$OUT/sweep.log" 2>&1 || rc=1
grep -E "sel_(fwd|bwd) " "$OUT/sweep.log"
D=/tmp/dump_decode; rm -rf "$D"
XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*step_jit.*" \
  timeout 200 python3 bench/decode.py --models nsa_125m --contexts 131072 --batches 64 \
  --profile 131072:64 --out "$OUT/dec.json" > "$OUT/dec.log" 2>&1 || rc=1
ops=$(python3 - "$OUT/dec.json" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
p = next(p for p in d["points"] if p["model"] == "nsa_125m" and "profile" in p)
skip = re.compile(r"nsa_|gemm|cudnn|memcpy|triton", re.I)
print(" ".join(o["name"] for o in p["profile"]["top_ops"] if not skip.search(o["name"]))[:3000])
PY
)
python3 bench/hlo_ops.py "$D" --ops $ops > "$OUT/ops.txt" 2>&1 || rc=1
mod=$(ls -S "$D"/*after_optimizations.txt 2>/dev/null | head -1)
[[ -n "$mod" ]] && xz -6 -c "$mod" > "$OUT/step_nsa.hlo.xz"
grep -E "^nsa_125m|^ *131072" "$OUT/dec.log" | tail -n 2
grep -E "^(#|[a-z_0-9]+: |    meta)" "$OUT/ops.txt" | cut -c1-170 | head -40
exit $rc
