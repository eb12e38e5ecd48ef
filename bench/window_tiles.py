"""Tile sweep of the document-local kernel (``pallas/local.py``) on the NSA window branch, packed
rows, fwd+bwd, bf16, against cuDNN's unpacked window in the same process (one GPU).

    PYTHONPATH=. python bench/window_tiles.py [--T 65536] [--reps 10] [--variants F=V,... ...]

``--variants``: BlockSizes fields per variant (default: the tile sweep below).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fields, timed  # noqa: E402
from packed import doc_lengths  # noqa: E402

from nsa_jax.nsa import NSAConfig, semantics  # noqa: E402
from nsa_jax.pallas import BlockSizes  # noqa: E402
from nsa_jax.pallas.window import window_attention  # noqa: E402

VARIANTS = [dict(win_q=64, win_keys=64, num_warps=4), dict(win_q=128, win_keys=64, num_warps=4),
            dict(win_q=128, win_keys=64, num_warps=8), dict(win_q=64, win_keys=128, num_warps=4),
            dict(win_q=128, win_keys=128, num_warps=8), dict(win_q=64, win_keys=32, num_warps=4),
            dict(win_q=64, win_keys=64, num_warps=4, num_stages=3)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--variants", nargs="+", metavar="F=V,...")
    a = p.parse_args(argv)
    variants = ([fields(filter(None, v.split(",")), BlockSizes) for v in a.variants]
                if a.variants else VARIANTS)
    cfg, T = NSAConfig(), a.T
    rng = np.random.default_rng(3)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((1, T, n, 64)), jnp.bfloat16)
                   for n in (12, 2, 2, 12))
    lengths = doc_lengths(T, 2048)
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
    lay = semantics.segment_layout(seg, cfg)

    def fb(s, bs):
        def f(q, k, v, ct):
            o, vjp = jax.vjp(lambda *x: window_attention(*x, cfg, False, seg=s, block_sizes=bs),
                             q, k, v)
            return o, vjp(ct.astype(jnp.float32))
        return jax.jit(f)

    rows = [{"variant": "cudnn unpacked", "ms": timed(fb(None, None), [(q, k, v, ct)], a.reps)}]
    for var in variants:
        bs = dataclasses.replace(BlockSizes(), **var)
        rows.append({"variant": var, "ms": timed(fb(lay, bs), [(q, k, v, ct)], a.reps)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"T": T, "device": jax.devices()[0].device_kind, "rows": rows}))


if __name__ == "__main__":
    main()
