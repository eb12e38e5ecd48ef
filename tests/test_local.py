"""Document-local attention kernel (``nsa_jax.pallas.local``, interpret mode) against masked
attention over an explicit [T, T] mask: values and all gradients, float32, <= 2e-5."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import semantics
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.local import doc_last, local_attention
from nsa_testutil import assert_launch_follows_num_warps, kernel_warps, rel_err
from packed_util import segments

HI = jax.lax.Precision.HIGHEST


def masked_local(q, k, v, start, window):
    """Plain masked softmax attention: query t sees s iff start(t) <= s <= t (and s > t - w)."""
    B, T, Hq, Dk = q.shape
    h = Hq // k.shape[2]
    kk, vv = jnp.repeat(k, h, axis=2), jnp.repeat(v, h, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, kk, precision=HI) / math.sqrt(Dk)
    t = jnp.arange(T)
    vis = semantics.window_visible(t[:, None], t[None, :], T + 1 if window is None else window,
                                   start[:, :, None])
    p = semantics.masked_softmax(s, vis[:, None])
    return jnp.einsum("bhts,bshd->bthd", p, vv, precision=HI)


def _inputs(seed, B, T, Hq, G, Dk, Dv):
    rng = np.random.default_rng(seed)
    n = lambda *s: jnp.asarray(2.0 * rng.standard_normal(s), jnp.float32)
    return n(B, T, Hq, Dk), n(B, T, G, Dk), n(B, T, G, Dv), n(B, T, Hq, Dv)


SMALL = BlockSizes(win_q=16, win_keys=16)


def _check_local(lengths, Hq, G, D, window, bs, seed):
    """``local_attention``'s output and dq / dk / dv against ``masked_local``'s (float32,
    interpret mode)."""
    seg = segments(lengths)
    start = semantics.document_starts(seg)
    B, T = seg.shape
    q, k, v, ct = _inputs(seed, B, T, Hq, G, D, D)

    def run(f):
        o, vjp = jax.vjp(f, q, k, v)
        return (o,) + vjp(ct)

    got = jax.jit(lambda: run(lambda a, b, c: local_attention(
        a, b, c, start, window, bs, interpret=True)))()
    want = run(lambda a, b, c: masked_local(a, b, c, start, window))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert np.abs(np.asarray(w)).max() > 0, name
        assert rel_err(g, w) <= 2e-5, (name, rel_err(g, w))


@pytest.mark.parametrize("lengths,Hq,G,D,window", [
    # documents of length 1, shorter than a tile, straddling tiles, a row cut mid-document
    ([[1, 5, 16, 21, 13], [40, 7, 9]], 4, 2, 8, 6),
    ([[1, 5, 16, 21, 13], [40, 7, 9]], 6, 1, 12, None),   # packed dense, h = 6, padded D
    ([[37]], 2, 2, 16, 20),                                # one document: plain window, h = 1
])
def test_local_matches_masked_attention(lengths, Hq, G, D, window):
    _check_local(lengths, Hq, G, D, window, SMALL, seed=len(lengths[0]) + Hq)


def test_doc_last():
    start = semantics.document_starts(segments([[1, 5, 3], [9]]))
    np.testing.assert_array_equal(doc_last(start), [[0, 5, 5, 5, 5, 5, 8, 8, 8], [8] * 9])


def test_bad_arguments_name_them():
    q, k, v, _ = _inputs(0, 1, 8, 3, 2, 8, 8)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        local_attention(q, k, v, interpret=True)
    q, k, v, _ = _inputs(0, 1, 8, 2, 2, 8, 8)
    with pytest.raises(ValueError, match="window"):
        local_attention(q, k, v, window=0, interpret=True)
    with pytest.raises(ValueError, match="start must have shape"):
        local_attention(q, k, v, jnp.zeros((1, 7), jnp.int32), interpret=True)


@pytest.mark.parametrize("lengths,Hq,G,window,bs", [
    # one document over the whole row, no window: the last query sees key 0 (the no-window span
    # must exceed T - 1); T = 33 = 2 * 16 + 1: the last key tile holds one key; query tiles twice
    # the key tiles (dK/dV's first query tile is kt * bk // bq, not kt)
    ([[33]], 2, 1, None, BlockSizes(win_q=32, win_keys=16)),
    # w = 18 = 2 (mod 16): query 32's oldest visible key 15 is the last key of tile 0, query 48's
    # (31) the last of tile 1 (forward / dQ key range), and key 15's newest query 32 the first of
    # query tile 2 (dK/dV query range)
    ([[5, 45]], 4, 2, 18, SMALL),
])
def test_local_tile_edges(lengths, Hq, G, window, bs):
    _check_local(lengths, Hq, G, 8, window, bs, seed=Hq + G)


def test_local_backward_applies_the_row_scale():
    """``local_backward``'s per-row output scale gs (the cotangent is gs * do): delta must carry
    it too (the op itself always passes gs = None)."""
    from nsa_jax.pallas.local import local_backward, local_forward
    lengths, Hq, G, D, window = [[7, 21]], 4, 2, 16, 6
    start = semantics.document_starts(segments(lengths))
    B, T = start.shape
    q, k, v, do = _inputs(3, B, T, Hq, G, D, D)
    gs = jax.random.uniform(jax.random.PRNGKey(0), (B, T, Hq), minval=0.2, maxval=1.0)
    scale = 1.0 / math.sqrt(D)

    @jax.jit
    def kernels(q, k, v, do, gs):
        o, lse = local_forward(q, k, v, start, window, SMALL, scale, True)
        return local_backward(q, k, v, start, o, lse, do, gs, window, SMALL, scale, True)

    got = kernels(q, k, v, do, gs)
    _, vjp = jax.vjp(lambda a, b, c: masked_local(a, b, c, start, window), q, k, v)
    want = vjp(do * gs[..., None])
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert rel_err(g, w) <= 2e-5, (name, rel_err(g, w))


def _local_warps(dtype, D, block_sizes=None):
    """The warps of the document-local forward and backward kernels, read from the jaxpr."""
    q = jnp.zeros((1, 64, 4, D), dtype)
    k = jnp.zeros((1, 64, 1, D), dtype)
    f = lambda q, k, v: jnp.sum(local_attention(q, k, v, block_sizes=block_sizes,
                                                interpret=True))
    return kernel_warps(jax.grad(f, argnums=(0, 1, 2)), q, k, k,
                        names=("nsa_local_fwd", "nsa_local_bwd_dq", "nsa_local_bwd_dkv"))


def test_local_kernels_take_4_warps_at_128_wide_heads():
    """The three local kernels (64-row tiles) take one warpgroup each at bf16 128-wide heads --
    the packed window at the bench shape, 64k: 25.5 against 41.6 ms at 8 warps on an H100
    (bench/NOTES.md, thirtieth session) -- and follow ``num_warps``."""
    assert_launch_follows_num_warps(_local_warps, BlockSizes.for_shape(4, 128))
    assert _local_warps(jnp.bfloat16, 128) == {4}         # no block_sizes: for_shape's
