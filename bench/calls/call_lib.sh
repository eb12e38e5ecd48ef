# Shared by the device-call scripts that source it (forty-ninth session on): the call's set-up and the GPU tests.
#   source bench/calls/call_lib.sh; call_start; gpu_tests tests/test_x.py ...
# call_start: OUT (default /tmp/nsa_call), the log $OUT/run.log opened with the GPU's name and driver, t0 and rc.
call_start() {
  export OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
  t0=$SECONDS; log="$OUT/run.log"; rc=0
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$log"
}
# gpu_tests FILE...: the -m gpu tests of FILE... (verbose, with prints) into the log, capped at TEST_S (200) s.
gpu_tests() {
  timeout "${TEST_S:-200}" python3 -m pytest -m gpu -p no:cacheprovider -v -s -W ignore::DeprecationWarning -rfE \
    "$@" >> "$log" 2>&1 || rc=1
  echo "  (GPU tests done at $((SECONDS - t0)) s)" | tee -a "$log"
}
# chunked_table NAME...: the records of bench/chunked_prefill.py in $OUT/NAME.log, one line each (chunk, wall and
# dispatch ms, the runs, compile seconds).
chunked_table() {
  local n
  for n in "$@"; do
    echo "== $n"
    grep '"chunk"' "$OUT/$n.log" | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['chunk'], 'ms', round(r['ms'], 1), 'sent', round(r['dispatch_ms'], 1),
        [round(t, 1) for t in r['times_ms']], 'compile', round(r['compile_s'], 1))"
  done
}
# prefill_bench NAME DIR: in DIR, nsa_125m's 64k prefill at C = 4,096 (`bench/chunked_prefill.py --no-whole --reps 7`),
# its JSON in $OUT/chunked_NAME.json and its output in $OUT/NAME.log, capped at BENCH_S (150) s; returns its status.
prefill_bench() {
  local name=$1 dir=$2
  (cd "$dir" && timeout "${BENCH_S:-150}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m \
    --lengths 65536 --no-whole --reps 7 --chunks 4096 --out "$OUT/chunked_$name.json") > "$OUT/$name.log" 2>&1
  local r=$?; echo "  ($name rc=$r at $((SECONDS - t0)) s)" | tee -a "$log"; return $r
}
