#!/usr/bin/env bash
# GPU training checks and benchmarks (issue 5), run from the repo root on the device machine:
#   bench/gpu_train_suite.sh single [probe]  # 1 GPU: profile 64k/2k steps, 2 reference loss runs
#   bench/gpu_train_suite.sh multi           # 2 GPUs: throughput at T=2048 on 1 GPU, 2 GPUs
#                                            # data-parallel and 2 GPUs FSDP
#   bench/gpu_train_suite.sh probe           # 1 GPU: short retrieval learnability probe
#   bench/gpu_train_suite.sh loss            # 2 GPUs (428 s measured): first-50-step losses, 1 GPU twice (noise
#                                            # floor, GPUs 0 and 1 at once), 2 GPUs data-parallel
#                                            # and FSDP, same global batch; compare
# Results (JSON) are copied to $OUT (default /tmp/nsa_train_out), every log and JSON also into
# $OUT/logs_<stages>.tgz (the device tool returns at most 8 files); a short table is printed last.
set -u
stages=("${@:-single}")
OUT=${OUT:-/tmp/nsa_train_out}
W=/tmp/nsa_train_work
mkdir -p "$OUT" "$W"
FINAL=$OUT
OUT=$W
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
rc=0
t0=$SECONDS
probe_start() {  # retrieval learnability, answers-only loss, nsa and dense sharing the GPU
  for att in nsa dense; do
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout -s TERM ${PROBE_S:-240} python3 -m nsa_jax.train \
      --config configs/quality_retrieval.yaml model.attention=$att data.retrieval.loss=answers \
      train.steps=100000 train.log_every=50 train.eval_every=200 train.ckpt_every=100000 \
      run.dir=/tmp/probe_$att > "$OUT/probe_$att.log" 2>&1 &
  done
}
probe_report() {
  for att in nsa dense; do echo "== probe $att"; grep -E "eval|^step [0-9]+/" "$OUT/probe_$att.log" | tail -n 8; done
}
for stage in "${stages[@]}"; do
if [[ $stage == single ]]; then
  python3 bench/profile_step.py --models nsa_125m dense_125m --points 65536:1 2048:16 \
    --steps 2 --out "$OUT/profile_h200.json" --trace-dir /tmp/traces > "$OUT/profile.log" 2>&1 || rc=1
  echo "profile done at $((SECONDS - t0))s"
  if [[ " ${stages[*]} " == *" probe "* ]]; then   # B=32 at 2k needs ~45 GB: leave it 55%
    probe_start; export XLA_PYTHON_CLIENT_MEM_FRACTION=0.55
  fi
  f=$(ls /tmp/traces/nsa_125m_65536x1/plugins/profile/*/perfetto_trace.json.gz 2>/dev/null | head -1)
  [[ -n $f ]] && cp "$f" "$FINAL/trace_nsa_64k.json.gz"
  for tag in 1gpu_a 1gpu_b; do
    python3 bench/loss_match.py run --tag $tag --devices 0 --out "$OUT/loss_match_run_$tag.json" \
      > "$OUT/loss_$tag.log" 2>&1 || rc=1
    tail -n 1 "$OUT/loss_$tag.log"
  done
  python3 bench/loss_match.py compare "$OUT"/loss_match_run_1gpu_a.json \
    "$OUT"/loss_match_run_1gpu_b.json || rc=1
  unset XLA_PYTHON_CLIENT_MEM_FRACTION
  wait
  if [[ " ${stages[*]} " == *" probe "* ]]; then probe_report; fi
  sed -n '/^== /,$p' "$OUT/profile.log" | grep -v "^wrote"
fi
if [[ $stage == probe && " ${stages[*]} " != *" single "* ]]; then
  probe_start; wait; probe_report
fi
if [[ $stage == multi ]]; then   # results go straight to $FINAL: a cut-short call keeps them
  python3 bench/train_throughput.py --no-loader --points 2048:16@1 2048:32@2 2048:32@2/2 \
    --models nsa_125m dense_125m --steps 10 --out "$FINAL/train_throughput_h200x2.json" \
    > "$OUT/tp_2gpu.log" 2>&1 || rc=1
  sed -n '/^model /,$p' "$OUT/tp_2gpu.log"
  echo "throughput done at $((SECONDS - t0))s"
fi
if [[ $stage == loss ]]; then   # results go straight to $FINAL as they come
  python3 -m nsa_jax.data.prepare --config configs/prepare_sample.yaml \
    data.out_dir=data_prepared/fineweb_edu_sample > "$OUT/prepare.log" 2>&1 || rc=1
  for d in 0 1; do
    tag=1gpu_$([[ $d == 0 ]] && echo a || echo b)
    python3 bench/loss_match.py run --tag $tag --devices $d \
      --out "$FINAL/loss_match_run_$tag.json" > "$OUT/loss_$tag.log" 2>&1 &
  done
  wait
  echo "1-GPU runs done at $((SECONDS - t0))s"; tail -qn 1 "$OUT"/loss_1gpu_*.log
  python3 bench/loss_match.py run --tag 2gpu_data --devices 0,1 \
    --out "$FINAL/loss_match_run_2gpu_data.json" > "$OUT/loss_2gpu_data.log" 2>&1 || rc=1
  tail -n 1 "$OUT/loss_2gpu_data.log"; echo "2gpu_data done at $((SECONDS - t0))s"
  python3 bench/loss_match.py run --tag 2gpu_fsdp --devices 0,1 --set mesh.data=1 mesh.fsdp=2 \
    --out "$FINAL/loss_match_run_2gpu_fsdp.json" > "$OUT/loss_2gpu_fsdp.log" 2>&1 || rc=1
  tail -n 1 "$OUT/loss_2gpu_fsdp.log"; echo "2gpu_fsdp done at $((SECONDS - t0))s"
  python3 bench/loss_match.py compare "$FINAL"/loss_match_run_1gpu_a.json \
    "$FINAL"/loss_match_run_1gpu_b.json "$FINAL"/loss_match_run_2gpu_data.json \
    "$FINAL"/loss_match_run_2gpu_fsdp.json --out "$FINAL/loss_match_h200x2.json" || rc=1
fi
echo "stage $stage finished at $((SECONDS - t0))s rc=$rc"
done
cp "$W"/profile_h200.json "$W"/loss_match_run_*.json "$W"/train_throughput_h200x2.json \
  "$W"/tp_*.json "$FINAL"/ 2>/dev/null
tag=$(IFS=_; echo "${stages[*]}")
tar czf "$FINAL/logs_$tag.tgz" -C "$W" .
ls -la "$FINAL"
exit $rc
