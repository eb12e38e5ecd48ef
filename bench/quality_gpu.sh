#!/usr/bin/env bash
# Issue 8 on ONE GPU in one command (< 9.5 min on an H200): the retrieval study (nsa, win, dense)
# and the loss-parity study (nsa, dense) train at the same time, sharing the GPU; after
# --time-budget-s any run still going is stopped with SIGTERM (it checkpoints and exits), then
# every run is evaluated from its newest checkpoint. Run from the repo root:
#
#   bench/quality_gpu.sh            # GPU; needs data_prepared/quality_parity (prepare-parity)
#   bench/quality_gpu.sh --smoke    # tiny sizes on any machine (CPU: ~3 min), same code path
#
# Writes to $OUT (default /tmp/quality_out), 5 files: quality_{retrieval,parity}_<device>.{json,png}
# and quality_logs.tgz (each run's log, metrics.jsonl, config.yaml, bench_train.json); prints a
# short table last. Environment: PYTHON (default python3), TRAIN_BUDGET_S (default 450 on GPU),
# RUNS (default runs/quality, or runs/quality_smoke with --smoke).
set -u
smoke=()
if [[ ${1:-} == --smoke ]]; then smoke=(--smoke); shift; fi
if [[ $# -gt 0 ]]; then echo "usage: bench/quality_gpu.sh [--smoke]" >&2; exit 2; fi
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/quality_out}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [[ ${#smoke[@]} -gt 0 ]]; then
  RUNS=${RUNS:-runs/quality_smoke}; budget=${TRAIN_BUDGET_S:-240}; tag=(--device-tag cpu_smoke)
else
  RUNS=${RUNS:-runs/quality}; budget=${TRAIN_BUDGET_S:-450}; tag=()
fi
t0=$SECONDS
$PY bench/quality.py all --parallel --time-budget-s "$budget" --runs "$RUNS" --results "$OUT" \
  "${tag[@]}" "${smoke[@]}"
rc=$?
echo "quality_gpu: bench/quality.py exit $rc after $((SECONDS - t0))s"
# every run's own records, in one file (the device tool returns at most 8 files)
files=()
for d in "$RUNS"/retrieval_* "$RUNS"/parity_*; do
  [[ -d $d ]] || continue
  for f in metrics.jsonl config.yaml bench_train.json env.json; do
    [[ -f $d/$f ]] && files+=("$d/$f")
  done
done
for f in "$RUNS"/*.log; do [[ -f $f ]] && files+=("$f"); done
if [[ ${#files[@]} -gt 0 ]]; then tar czf "$OUT/quality_logs.tgz" "${files[@]}"; fi
ls -l "$OUT"
echo "quality_gpu: total $((SECONDS - t0))s"
$PY bench/quality.py table --results "$OUT" "${tag[@]}" || rc=1
exit $rc
