#!/usr/bin/env bash
# One device call (issue 14, twelfth session): GPU decode tests, then the decode kernels alone
# (bench/decode_kernels.py): the tree before ($1), this tree with tile variants, and three copies of
# this tree with one part of the scoring kernel taken out (a profile by ablation: the image has no
# ncu): norank (no rank count), nolse (no merge of the splits' lse), onehead (1 of the h heads).
# Usage: bash bench/calls/gpu_score12.sh OLD_TREE ["variant ..."]; JSON and logs under $OUT.
set -u
OLD=$1
VARS=${2:-"default sel_chunk=64 sel_chunk=256 slc_per=2 slc_per=4"}
OUT=${OUT:-/tmp/nsa_call}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 PYTHONPATH=.; rc=0
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout 200 python3 -m pytest -q -p no:xdist -m gpu -rfE tests/test_decode.py > "$OUT/tests.log" 2>&1 || rc=1
grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/tests.log"
ablate() {  # ablate NAME OLD_TEXT NEW_TEXT: /tmp/abl_NAME/nsa_jax with that replacement
  local d=/tmp/abl_$1; rm -rf "$d"; mkdir -p "$d"; cp -r nsa_jax "$d/"
  python3 - "$d/nsa_jax/pallas/decode.py" "$2" "$3" <<'PY'
import sys
p, old, new = sys.argv[1:]
s = open(p).read()
assert old in s, old
open(p, "w").write(s.replace(old, new))
PY
}
ablate norank "rank = jnp.sum(ahead.astype(jnp.int32), axis=1)" "rank = a"
ablate nolse "lse_h = _lse_head(m_ref, l_ref, b, g, hh, nsp)" "lse_h = 0.0"
ablate onehead "    for hh in range(h):
        lse_h" "    for hh in range(1):
        lse_h"
timeout 200 python3 bench/decode_kernels.py --points 131072:64 65536:8 --variants $VARS \
  --out "$OUT/kern_new.json" > "$OUT/kern_new.log" 2>&1 || rc=1
timeout 100 python3 bench/decode_kernels.py --points 131072:64 65536:8 --tree "$OLD" \
  --out "$OUT/kern_old.json" > "$OUT/kern_old.log" 2>&1 || rc=1
for a in norank nolse onehead; do
  timeout 80 python3 bench/decode_kernels.py --points 131072:64 --tree /tmp/abl_$a \
    --out "$OUT/kern_$a.json" > "$OUT/kern_$a.log" 2>&1 || rc=1
done
echo "== before"; grep -v "^{" "$OUT/kern_old.log" | grep "N=" | tail -n 4
echo "== now"; grep -v "^{" "$OUT/kern_new.log" | grep "N=" | tail -n 12
for a in norank nolse onehead; do echo "== $a"; grep "N=" "$OUT/kern_$a.log" | tail -n 2; done
exit $rc
