#!/usr/bin/env bash
# One device call (fifty-first session, call 2): where a continuation chunk's compressed forward and block scores spend
# their time. `bench/chunk_tiles.py --kinds nsa --profile 10` (one layer, kernels per call) at (C, start) =
# (4,096, 61,440) with three settings, (1,024, 64,512) and (4,096, 28,672) with the default, and a second round of
# call 1's two C = 16,384 settings that won by >= 5%.
#   bash bench/calls/gpu_call51b.sh
set -u
source bench/calls/call_lib.sh
call_start
run() {  # run NAME CHUNK START SETTING...
  local n=$1 C=$2 S=$3; shift 3
  timeout "${TILES_S:-100}" env PYTHONPATH=. python3 bench/chunk_tiles.py --kinds nsa --chunk "$C" --start "$S" \
    --profile 10 --only "$@" --out "$OUT/$n.json" > "$OUT/$n.log" 2>&1 || rc=1
  echo "  ($n at $((SECONDS - t0)) s)" | tee -a "$log"
}
run c4096 4096 61440 default "score q16" "cmp rows64"
run c1024 1024 64512 default
run c4096_half 4096 28672 default
run c16384 16384 49152 default "cmp rows64 score q16" "sel k32 w1 s3"
for n in c4096 c1024 c4096_half c16384; do echo "== $n"; grep -A 12 '^kind ' "$OUT/$n.log"; done
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
