#!/usr/bin/env bash
# One device call (issue 14, twelfth session): the decode step at 128k/B=64, NSA and dense, under three
# XLA command-buffer (CUDA graph) settings: XLA's default, off, and the default plus WHILE and
# CONDITIONAL (the decode loop's lax.scan as one graph). The default run also profiles the step with an
# XLA dump of the same process and names NSA's top XLA ops (bench/hlo_ops.py). JSON under $OUT.
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
D=/tmp/dump_decode; rm -rf "$D"
XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*step_jit.*" \
  timeout 200 python3 bench/decode.py --contexts 131072 --batches 64 --profile 131072:64 \
  --out "$OUT/dec_default.json" > "$OUT/dec_default.log" 2>&1 || rc=1
ops=$(python3 - "$OUT/dec_default.json" <<'PY'
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
XLA_FLAGS="--xla_gpu_enable_command_buffer=" timeout 200 python3 bench/decode.py --contexts 131072 \
  --batches 64 --out "$OUT/dec_off.json" > "$OUT/dec_off.log" 2>&1 || rc=1
XLA_FLAGS="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" timeout 200 python3 bench/decode.py \
  --contexts 131072 --batches 64 --out "$OUT/dec_while.json" > "$OUT/dec_while.log" 2>&1 || rc=1
for m in default off while; do echo "== $m"; grep -E "^ *131072" "$OUT/dec_$m.log" | tail -n 1; done
grep -E "^(#|[a-z_0-9]+: |    meta)" "$OUT/ops.txt" | cut -c1-170 | head -48
exit $rc
