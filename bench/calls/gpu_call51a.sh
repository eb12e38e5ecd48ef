#!/usr/bin/env bash
# A device call prepared in the fiftieth session for the next one (not yet run): (1) the continuation chunk's
# compressed forward and scoring tile settings at C = 4,096 and 16,384 (`bench/chunk_tiles.py --kinds nsa`, one layer);
# (2) nsa_125m's 64k prefill at once and at C = 4,096 after `init_cache`'s one-call form (fiftieth session: -36 ms at
# C = 4,096, not measured at once).
#   bash bench/calls/gpu_call51a.sh
set -u
source bench/calls/call_lib.sh
call_start
for p in 4096:61440 16384:49152; do IFS=: read -r C S <<< "$p"
  timeout "${TILES_S:-120}" env PYTHONPATH=. python3 bench/chunk_tiles.py --kinds nsa --chunk "$C" --start "$S" \
    --out "$OUT/tiles_$C.json" > "$OUT/tiles_$C.log" 2>&1 || rc=1
  echo "  (tiles C=$C at $((SECONDS - t0)) s)" | tee -a "$log"
done
timeout "${BENCH_S:-240}" env PYTHONPATH=. python3 bench/chunked_prefill.py --models nsa_125m --lengths 65536 \
  --reps 7 --chunks 4096 --out "$OUT/chunked.json" > "$OUT/chunked.log" 2>&1 || rc=1
for C in 4096 16384; do echo "== tiles C=$C"; tail -n 14 "$OUT/tiles_$C.log"; done
chunked_table chunked
echo "done: $((SECONDS - t0)) s" | tee -a "$log"
exit $rc
