#!/usr/bin/env bash
# One device call (twenty-fifth session, issue 15): the 125M train step at 2k / B=16 with the compressed branch on
# the Pallas kernels (cmp_pallas_max_t = 4096, this tree) against the old rule (cuDNN at every T, by override) --
# bench/profile_step.py, device busy per step, two processes; then the document-local window kernel's tiles at 2k
# (bench/profile_op.py with win_attn=pallas).
set -u
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PYTHONPATH=. timeout 200 python3 bench/profile_step.py --models nsa_125m --points 2048:16 --steps 2 --top 40 \
  --override exec.kernel.cmp_pallas_max_t=0 --out "$OUT/step_old.json" > "$OUT/step_old.log" 2>&1 || rc=1
echo "old rule done at ${SECONDS}s"
PYTHONPATH=. timeout 250 python3 bench/profile_step.py --models nsa_125m dense_125m --points 2048:16 --steps 2 \
  --top 40 --out "$OUT/step.json" > "$OUT/step.log" 2>&1 || rc=1
echo "this tree done at ${SECONDS}s"
TMP=$(mktemp -d); LOG="$OUT/tiles.log"
for q in 64 128; do
  for k in 32 64 128; do
    [[ $SECONDS -gt 560 ]] && break
    echo "== q$q k$k (t=${SECONDS}s)" >> "$LOG"
    PYTHONPATH=. timeout 40 python3 bench/profile_op.py --shape 125m --T 2048 --B 16 --reps 5 --top 40 \
      --choices win_attn=pallas --tiles win_q=$q win_keys=$k --out "$TMP/op_q${q}_k$k.json" >> "$LOG" 2>&1 || rc=1
  done
done
python3 bench/op_table.py "$TMP" "$OUT/tiles.json" --op nsa_local_fwd nsa_local_bwd_dq nsa_local_bwd_dkv | tee -a "$LOG"
for f in step_old step; do grep -E "^== |attention|fusion|gemm|copy" "$OUT/$f.log" | head -12; done
grep -E "Error|Traceback" "$OUT"/*.log | head -5
exit $rc
