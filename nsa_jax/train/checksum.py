"""Exact checksums of array trees, stored in a checkpoint's ``meta`` and checked on restore.

Orbax detects files it cannot parse, but not every corruption of array bytes decodes to an
error. Each leaf's checksum is ``sum_i word_i * (2 i + 1) mod 2**32`` over its elements' bit
patterns (as unsigned 32-bit words; 8- and 16-bit types widened): integer arithmetic, so the
result is exact and independent of sharding and reduction order, and any single changed
element changes it (odd multipliers are invertible mod 2**32). Computed on device by one jitted
reduction per tree.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from nsa_jax.train.optim import path_str

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _leaf_sum(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.bool_):
        x = x.astype(jnp.uint8)
    size = np.dtype(x.dtype).itemsize
    if size not in _UINT:        # 64-bit leaves (x64 mode only): split into two words
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    else:
        words = jax.lax.bitcast_convert_type(x, _UINT[size]).astype(jnp.uint32)
    words = words.reshape(-1)
    odd = jnp.arange(words.shape[0], dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(words * odd, dtype=jnp.uint32)


_tree_sums = jax.jit(lambda tree: jax.tree.map(_leaf_sum, tree))


def checksums(tree) -> dict[str, int]:
    """``{leaf path: checksum}`` of an array tree (blocks until computed)."""
    sums = jax.device_get(_tree_sums(tree))
    return {path_str(p): int(v) for p, v in jax.tree_util.tree_flatten_with_path(sums)[0]}


def first_mismatch(stored: dict, tree) -> str | None:
    """The first leaf path whose checksum differs from ``stored`` (None: all match)."""
    now = checksums(tree)
    for k in sorted(set(stored) | set(now)):
        if stored.get(k) != now.get(k):
            return k
    return None
