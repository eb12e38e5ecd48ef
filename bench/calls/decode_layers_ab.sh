# Sourced by gpu_call44a-c.sh (forty-fourth session; they ran from a tree with bench/wip/decode-layers.patch
# applied). Uses the caller's OUT, log, t0 and rc.
#   layers_tests TIMEOUT_S TEST_FILE...        the GPU tests of those files
#   layers_sweep TIMEOUT_S "BATCHES" VARIANT...  bench/decode_layers.py, one line per (batch, variant)
#   layers_ab TIMEOUT_S TOP                      both models at 64k / B=8 with exec.decode_layers=pallas (profiled)
#                                                and =xla, one process each, then the pallas run's TOP kernels
layers_tests() {
  local to=$1; shift
  timeout "$to" python3 -m pytest -m gpu -p no:cacheprovider -q -W ignore::DeprecationWarning "$@" \
    > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "passed|failed|FAILED|rror" "$OUT/tests.log" | tail -8 | tee -a "$log"
  echo "  (tests done at $((SECONDS - t0)) s)" | tee -a "$log"
}
layers_sweep() {
  local to=$1 batches=$2; shift 2
  PYTHONPATH=. timeout "$to" python3 -W ignore::DeprecationWarning bench/decode_layers.py --batches $batches \
    --variants "$@" --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1 || rc=1
  sed -E 's/(us per layer).*/\1/' "$OUT/layers.log" | grep "^B=" | tee -a "$log"
  grep -E "^B=  8 (default|xla)" "$OUT/layers.log" | cut -c1-260 | tee -a "$log"
  echo "  (layers done at $((SECONDS - t0)) s)" | tee -a "$log"
}
layers_ab() {
  local tag prof
  for tag in pallas xla; do
    prof=(); [ "$tag" = pallas ] && prof=(--profile 65536:8)
    PYTHONPATH=. timeout "$1" python3 -W ignore::DeprecationWarning bench/decode.py --contexts 65536 --batches 8 \
      --reps 30 --set exec.decode_layers=$tag "${prof[@]}" --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1 || rc=1
    grep -E "^(nsa|dense)_125m" "$OUT/decode_$tag.log" | sed "s/^/$tag  /" | tee -a "$log"
    echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
  done
  [ -f "$OUT/decode_pallas.json" ] && python3 bench/decode_summary.py "$OUT/decode_pallas.json" pallas --top "$2" | tee -a "$log"
}
