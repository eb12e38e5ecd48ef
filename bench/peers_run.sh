#!/usr/bin/env bash
# The peers table at the bench shape, 64k, into $OUT (bench/peers.py): installs the carried fla-core wheel
# (.whl) into /tmp/site and reads XunhaoLai's kernels from the carried checkout .peers/xunhao. Sourced by the
# device-call scripts; sets rc=1 on a failure.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || rc=1
PYTHONPATH=/tmp/site:. timeout ${PEERS_S:-330} python3 -P bench/peers.py --shapes bench --T 65536 \
  --peer-src .peers/xunhao --out "$OUT/peers.json" > "$OUT/peers.log" 2>&1 || rc=1
sed -n '/^shape/,$p' "$OUT/peers.log" | tail -n 22
