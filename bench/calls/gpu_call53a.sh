#!/usr/bin/env bash
# Prepared in the fifty-second session for the next one (not yet run): `kernel.cmp_grouping` "repeat" against
# "transpose". (1) the GPU parity tests of the repeat order (cuDNN grouped op at 125M and bench heads, all 8
# gradients; the cuDNN chunk); (2) the op's device time per kernel, one process per setting, alternated, two rounds,
# at 125M 8k / B=4 and the bench shape at 64k (`bench/profile_op.py --choices cmp_grouping=...`).
#   bash bench/calls/gpu_call53a.sh
set -u
source bench/calls/call_lib.sh
call_start
TEST_S=${TEST_S:-200} gpu_tests tests/test_pallas_gpu.py tests/test_chunk_cmp_grouped.py \
  -k "(cmp_attn_cudnn and repeat) or cudnn_chunk"
for round in 1 2; do
  for g in transpose repeat; do
    for pt in 125m:8192:4 bench:65536:1; do IFS=: read -r shape T B <<< "$pt"
      timeout "${OP_S:-120}" env PYTHONPATH=. python3 bench/profile_op.py --shape "$shape" --T "$T" --B "$B" \
        --choices "cmp_grouping=$g" --out "$OUT/op_${shape}_${g}_$round.json" > "$OUT/op_${shape}_${g}_$round.log" 2>&1 || rc=1
      echo "  ($shape $g round $round at $((SECONDS - t0)) s)" | tee -a "$log"
    done
  done
done
grep -E "PASS|FAIL|ERROR|passed|failed" "$log" | tail -n 8
python3 - "$OUT" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "op_*.json"))):
    d = json.load(open(f))
    cud = sum(k["ms_per_step"] for k in d["top_kernels"] if "cudnn" in k["name"] or "fmha" in k["name"])
    tr = sum(o["ms_per_step"] for o in d["top_ops"] if "transpose" in o["name"])
    print(f"{os.path.basename(f):34} busy {d['device_busy_ms_per_step']:8.3f}  cuDNN {cud:7.3f}  transposes {tr:6.3f}")
PY
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
