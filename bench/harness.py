"""The benchmarks' shared harness: the two head shapes and the NSA config every kernel benchmark
uses (``SHAPES``, ``CFG``), their random inputs (:func:`make_inputs`, :func:`setup`), the timing
loop (:func:`timed`) and ``field=value`` overrides of a dataclass (:func:`fields`). ``INTERP``:
no GPU, so the Pallas kernels run in interpret mode."""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp

from nsa_jax.nsa import NSAConfig
from nsa_jax.pallas import BlockSizes

# Hq, G, D. "125m-wide": the 125M model with 128-wide heads (model.head_dim=128 model.n_heads=8:
# h = 4), whose groups take the block-major selection kernels above 4k tokens as 125M's do.
SHAPES = {"bench": (64, 4, 128), "125m": (12, 2, 64), "125m-wide": (8, 2, 128)}
CFG = NSAConfig(block_l=32, stride_d=16, sel_block=64, n_sel=16, window=512)
INTERP = jax.default_backend() != "gpu"  # --smoke also runs on the CPU (interpret mode)


def timed(fn, argsets, reps, warmup=3):
    """Median ms of fn(*args) over reps calls, alternating argument sets."""
    jax.block_until_ready(fn(*argsets[0]))  # compile
    for i in range(warmup):
        jax.block_until_ready(fn(*argsets[i % len(argsets)]))
    ts = []
    for i in range(reps):
        a = argsets[i % len(argsets)]
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*a))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def make_inputs(seed, T, Hq, G, D, dtype=jnp.bfloat16, B=1):
    ks = jax.random.split(jax.random.PRNGKey(seed), 9)
    Tc = CFG.num_cmp_blocks(T)
    n = lambda k, s: jax.random.normal(k, s, jnp.float32).astype(dtype)
    return (n(ks[0], (B, T, Hq, D)), n(ks[1], (B, Tc, G, D)), n(ks[2], (B, Tc, G, D)),
            n(ks[3], (B, T, G, D)), n(ks[4], (B, T, G, D)), n(ks[5], (B, T, G, D)),
            n(ks[6], (B, T, G, D)), jax.nn.sigmoid(n(ks[7], (B, T, Hq, 3))).astype(dtype),
            n(ks[8], (B, T, Hq, D)))


def setup(shape, T):
    """One head shape at T -> (Hq, G, D, its BlockSizes, the softmax scale, two input sets)."""
    Hq, G, D = SHAPES[shape]
    return (Hq, G, D, BlockSizes.for_shape(Hq // G, D), 1.0 / math.sqrt(D),
            [make_inputs(s, T, Hq, G, D) for s in (0, 1)])


def fields(specs, cls):
    """["f=v", ...] -> {f: v} with v typed like the dataclass default (an int where the default
    is None; ``--tiled-vars`` takes one comma-joined list per variant; bench/profile_op.py,
    score_topn.py, window_tiles.py)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    out = {}
    for spec in specs or ():
        f, v = spec.split("=", 1)
        if f not in defaults:
            raise SystemExit(f"{cls.__name__} has no field {f!r}")
        out[f] = (int if defaults[f] is None else type(defaults[f]))(v)
    return out
