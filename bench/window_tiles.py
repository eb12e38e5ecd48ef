"""Tile sweep of the document-local kernel (``pallas/local.py``) on the NSA window branch, packed
rows, fwd+bwd (``ms``) and forward alone (``fwd_ms``), bf16, against cuDNN's unpacked window in
the same process (one GPU).

    PYTHONPATH=. python bench/window_tiles.py [--T 65536] [--shape 125m|bench] [--reps 10] \
        [--variants F=V,... ...]

``--variants``: BlockSizes fields per variant over the shape's defaults
(``BlockSizes.for_shape``; ``default`` = those alone; no ``--variants``: the tile sweep below).
``--shape``: the head layout (``harness.SHAPES``: 125M 12 / 2 / 64, bench 64 / 4 / 128).
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
from harness import SHAPES, fields, timed  # noqa: E402
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
    p.add_argument("--shape", choices=sorted(SHAPES), default="125m")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--variants", nargs="+", metavar="F=V,...")
    a = p.parse_args(argv)
    variants = ([fields(filter(None, v.replace("default", "").split(",")), BlockSizes)
                 for v in a.variants] if a.variants else VARIANTS)
    cfg, T = NSAConfig(), a.T
    Hq, G, D = SHAPES[a.shape]
    base = BlockSizes.for_shape(Hq // G, D)
    rng = np.random.default_rng(3)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((1, T, n, D)), jnp.bfloat16)
                   for n in (Hq, G, G, Hq))
    lengths = doc_lengths(T, 2048)
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
    lay = semantics.segment_layout(seg, cfg)

    def fb(s, bs):
        def f(q, k, v, ct):
            o, vjp = jax.vjp(lambda *x: window_attention(*x, cfg, False, seg=s, block_sizes=bs),
                             q, k, v)
            return o, vjp(ct.astype(jnp.float32))
        return jax.jit(f)

    def fwd(s, bs):
        return jax.jit(lambda q, k, v: window_attention(q, k, v, cfg, False, seg=s,
                                                        block_sizes=bs))

    def row(name, s, bs):
        return {"variant": name, "ms": timed(fb(s, bs), [(q, k, v, ct)], a.reps),
                "fwd_ms": timed(fwd(s, bs), [(q, k, v)], a.reps)}

    rows = [row("cudnn unpacked", None, None)]
    print(json.dumps(rows[-1]), flush=True)
    for var in variants:
        rows.append(row(var or "default", lay, dataclasses.replace(base, **var)))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"T": T, "shape": a.shape, "device": jax.devices()[0].device_kind,
                      "rows": rows}))


if __name__ == "__main__":
    main()
