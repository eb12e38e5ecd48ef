"""``pallas.decode_dense``: the dense model's decode attention (flash-decoding) against
``nsa.decoding.dense_decode_attention``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa.decoding import dense_decode_attention
from nsa_jax.pallas.decode_dense import dense_decode_pallas, dense_splits


def _inputs(B, Hq, G, S, D, dtype=jnp.float32, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(ks[0], (B, Hq, D)).astype(dtype),
            jax.random.normal(ks[1], (B, G, S, D)).astype(dtype),
            jax.random.normal(ks[2], (B, G, S, D)).astype(dtype))


@pytest.mark.parametrize("B,Hq,G,S,D,keys,splits,ts", [
    (3, 4, 2, 100, 8, 16, None, [0, 37, 99]),   # t = 0, mid-tile, the last slot; D padded to 16
    (2, 6, 2, 64, 16, 16, 3, [63, 5]),           # h = 3 (rows padded to 16), uneven splits
    (1, 2, 1, 300, 32, 32, 64, [250]),           # more splits than visible tiles
    (1, 2, 1, 1024, 16, 16, 256, [700]),         # MAX_SPLITS: the finishing merge's widest load
])
def test_dense_decode_pallas_matches_xla(B, Hq, G, S, D, keys, splits, ts):
    """float32, interpret mode: == the XLA decode attention to float rounding, for rows at
    different positions, caches not a multiple of the tile, splits that get no tile."""
    q, k, v = _inputs(B, Hq, G, S, D)
    t = jnp.asarray(ts, jnp.int32)
    got = dense_decode_pallas(q, k, v, t, keys=keys, splits=splits)
    want = dense_decode_attention(q, k, v, t)
    assert got.shape == want.shape and got.dtype == q.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_dense_decode_pallas_ignores_slots_past_t():
    """Keys and values past t[b] (garbage, even NaN) never reach the output."""
    q, k, v = _inputs(2, 4, 2, 80, 16)
    t = jnp.asarray([10, 47], jnp.int32)
    pos = jnp.arange(80)[None, None, :, None]
    bad = pos > t[:, None, None, None]
    got = dense_decode_pallas(q, jnp.where(bad, jnp.nan, k), jnp.where(bad, 1e9, v), t, keys=16)
    np.testing.assert_allclose(got, dense_decode_attention(q, k, v, t), rtol=2e-5, atol=2e-5)


def test_dense_splits_rule():
    assert dense_splits(8, 2, 65536 + 256) == 128      # 2048 programs / 16 (row, group) pairs
    assert dense_splits(1, 2, 131072) == 256           # capped
    assert dense_splits(64, 2, 8192) == 16
    assert dense_splits(1, 1, 40) == 1                 # one tile
    assert dense_splits(1, 2, 131072, dv=128) == 128   # the merge's load: 16k partial outputs


def test_dense_decode_bad_input_is_one_clear_error():
    q, k, v = _inputs(1, 4, 2, 32, 16)
    with pytest.raises(ValueError, match="keys must be a power of two"):
        dense_decode_pallas(q, k, v, 3, keys=24)
    with pytest.raises(ValueError, match="Hq a multiple of G"):
        dense_decode_pallas(q[:, :3], k, v, 3)
    with pytest.raises(ValueError, match=r"k \[B,G,S,Dk\]"):      # q's batch != the caches'
        dense_decode_pallas(jnp.concatenate([q, q]), k, v, 3)
    with pytest.raises(ValueError, match=r"q \[B,Hq,Dk\], k \[B,G,S,Dk\]"):
        dense_decode_pallas(q, k[0], v, 3)
    for bad in (0, -1, 2.0, 257):
        with pytest.raises(ValueError, match="splits must be an int in 1..256"):
            dense_decode_pallas(q, k, v, 3, splits=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("B,S,ts", [(8, 65536 + 256, "last"), (3, 4096, [0, 1000, 4095])])
def test_gpu_dense_decode_bf16_matches_xla(B, S, ts):
    """Compiled, bf16, the 125M shape (Hq=12, G=2, D=64): relative RMSE <= 5e-3 against the
    float32 XLA attention."""
    q, k, v = _inputs(B, 12, 2, S, 64, jnp.bfloat16, seed=B)
    t = jnp.full((B,), S - 257, jnp.int32) if ts == "last" else jnp.asarray(ts, jnp.int32)
    got = np.asarray(jax.jit(dense_decode_pallas)(q, k, v, t), np.float32)
    f32 = lambda a: a.astype(jnp.float32)
    want = np.asarray(dense_decode_attention(f32(q), f32(k), f32(v), t))
    rr = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))
    assert rr <= 5e-3, rr
