#!/usr/bin/env bash
# One device call (twenty-sixth session, issues 14 and 15): (1) GPU tests: the Pallas decode kernels against the
# jax.numpy decode (now also at 128k / B=1, 128 splits), the decoder with a Pallas prefill, the compiled top-n at 64k;
# (2) bench/decode_kernels.py at five points, the new split rule (default) against the old split counts; (3) the op
# at 125M 64k profiled under an XLA dump and its XLA fusions named (bench/hlo_ops.py); (4) the 125M 64k train step
# of NSA at this tree (bench/train_throughput.py; dense runs in the next call on the same warm machine).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TMP=$(mktemp -d)
PYTHONPATH=. timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_decode.py \
  tests/test_pallas_gpu.py -k "decode or topn_compiled" > "$OUT/tests.log" 2>&1 || rc=1
grep -E "PASSED|FAILED|passed|failed|Error" "$OUT/tests.log" | tail -8; echo "tests done at ${SECONDS}s"
dk() { PYTHONPATH=. timeout 60 python3 bench/decode_kernels.py --points "$1" --variants default "splits=$2" \
  --out "$TMP/dk_$1.json" >> "$OUT/decode.log" 2>&1 || rc=1; }
dk 131072:1 32; dk 65536:1 32; dk 65536:8 32; dk 131072:8 32; dk 131072:64 16
python3 - "$TMP" "$OUT/decode_kernels.json" <<'PY'
import glob, json, sys
pts = [p for f in sorted(glob.glob(sys.argv[1] + "/dk_*.json")) for p in json.load(open(f))["points"]]
json.dump(pts, open(sys.argv[2], "w"), indent=1)
PY
grep -E "us/layer" "$OUT/decode.log" | cut -c14-200; echo "decode done at ${SECONDS}s"
DUMP=$TMP/dump
XLA_FLAGS="--xla_dump_to=$DUMP --xla_dump_hlo_as_text" PYTHONPATH=. timeout 90 python3 bench/profile_op.py \
  --shape 125m --T 65536 --B 1 --reps 3 --top 40 --out "$TMP/op64k.json" > "$OUT/op.log" 2>&1 || rc=1
python3 bench/hlo_ops.py "$DUMP" --profile "$TMP/op64k.json" --top 14 >> "$OUT/op.log" 2>&1 || rc=1
cp "$TMP/op64k.json" "$OUT/op64k.json"; echo "op done at ${SECONDS}s"
PYTHONPATH=. timeout $((590 - SECONDS)) python3 bench/train_throughput.py --no-loader --models nsa_125m \
  --points 65536:1 --steps 8 --out "$OUT/train_64k_nsa.json" > "$OUT/train.log" 2>&1 || rc=1
tail -2 "$OUT/train.log"; echo "train done at ${SECONDS}s"
exit $rc
