#!/usr/bin/env bash
# Kernel checks + peers on the device machine (repo root; carry .whl and .peers):
#   bench/kernels_gpu.sh [tests] [peers] [peers-smoke] [packed] [packed-train] [cmp] [selblock]
# tests: every @gpu kernel test; peers: bench/peers.py (fla-core from .whl, XunhaoLai from
# .peers/xunhao) at the bench and 125m shapes, T = 16k and 64k; packed: bench/packed.py (window
# branch, NSA, dense; packed vs unpacked at 8k and 64k); packed-train: 125M training tok/s with
# data.packing concat vs documents; cmp: bench/cmp_attn.py (compressed attention Pallas vs grouped
# cuDNN, KernelChoices.cmp_attn); selblock: bench/sel_block.py (selection kernels query- vs
# block-major, KernelChoices.sel_fwd / sel_dq, 125M shape). Logs in $OUT/kernels.log.
set -u
OUT=${OUT:-/tmp/nsa_kernels_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/kernels.log"
rc=0
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "$LOG" 2>&1 || rc=1
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
peer=(); [[ -d .peers/xunhao ]] && peer=(--peer-src .peers/xunhao)
for stage in "$@"; do
  echo "== $stage" | tee -a "$LOG"
  case $stage in
    tests)
      python3 -m pytest -q -p no:xdist -m gpu tests/test_pallas_gpu.py tests/test_pallas_tiled.py \
        tests/test_decode.py -rfE -s >> "$LOG" 2>&1 || rc=1
      grep -E "^(FAILED|ERROR)|passed|failed|f32_dot|ieee|tf32" "$LOG" | tail -n 20 ;;
    peers-smoke)
      python3 bench/peers.py --smoke "${peer[@]}" --out "$OUT/peers_smoke.json" >> "$LOG" 2>&1 \
        || rc=1
      tail -n 15 "$LOG" ;;
    peers)
      timeout 480 python3 bench/peers.py --shapes bench 125m --T 16384 65536 "${peer[@]}" \
        --out "$OUT/peers_h200.json" >> "$LOG" 2>&1 || rc=1
      sed -n '/^shape/,$p' "$LOG" | tail -n 40 ;;
    packed)
      timeout 420 python3 bench/packed.py --T 8192 65536 --reps 10 \
        --attention window nsa dense parts > "$OUT/packed.jsonl" 2>> "$LOG" || rc=1
      grep -E "speed|parts" "$OUT/packed.jsonl" ;;
    cmp)
      timeout 480 python3 bench/cmp_attn.py --shapes bench 125m --T 16384 65536 \
        --out "$OUT/cmp_attn_h200.json" >> "$LOG" 2>&1 || rc=1
      sed -n '/^shape /,$p' "$LOG" | tail -n 6 ;;
    selblock)
      timeout 300 python3 bench/sel_block.py --quick --shapes 125m --T 8192 65536 \
        --out "$OUT/sel_block_h200.json" >> "$LOG" 2>&1 || rc=1
      tail -n 3 "$LOG" ;;
    packed-train)
      timeout 540 python3 bench/train_throughput.py --no-loader --packing concat documents \
        --points 8192:4 65536:1 --out "$OUT/train_packed_h200.json" >> "$LOG" 2>&1 || rc=1
      sed -n '/^model/,$p' "$LOG" | tail -n 10 ;;
  esac
done
exit $rc
