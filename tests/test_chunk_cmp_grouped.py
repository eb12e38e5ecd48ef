"""A continuation chunk's compressed attention (NSA Eq. 7-8) as two plain attentions in the
grouped layout (``cmp_grouped.cmp_chunk_grouped``: the blocks before the chunk's first grouped
row, and a causal square over its own), so that cuDNN runs it: equal to the Pallas packed-rows
kernel with the chunk's offset layout (o and the base-2 lse the scores need), and through
``nsa_chunk_pallas`` to the jax.numpy chunk. "xla" is the CPU twin of "cudnn"."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from nsa_jax.nsa.chunked import nsa_chunk_attention
from nsa_jax.pallas.chunk import chunk_cmp_attn, nsa_chunk_pallas, offset_layout
from nsa_jax.pallas.cmp_grouped import cmp_chunk_grouped
from nsa_jax.pallas.common import BlockSizes
from nsa_jax.pallas.compressed import cmp_forward
from nsa_testutil import chunk_inputs, rel_err

SMALL = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)


def _cmp_inputs(seed, B, C, G, h, D, Tc, dtype=jnp.float32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(ks[0], (B, C, G * h, D), dtype),
            jax.random.normal(ks[1], (B, Tc, G, D), dtype),
            jax.random.normal(ks[2], (B, Tc, G, D), dtype))


@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
@pytest.mark.parametrize("cfg,start,C", [
    (SMALL, 64, 32),     # r0 = 1: the chunk's first query is the second of its grouped row
    (SMALL, 16, 37),     # C not a multiple of d; the last row partial
    (NSAConfig(block_l=16, stride_d=16, sel_block=16, n_sel=4), 16, 40),  # c0 = 0: no part A
    (NSAConfig(), 128, 100),   # the paper's l = 32, d = 16, l' = 64
], ids=["r0=1", "C%d", "c0=0", "paper"])
def test_grouped_chunk_equals_the_packed_kernel(cfg, start, C, grouping):
    """o and lse2 of every query equal the Pallas kernel's over the same 240-token cache
    (interpret mode, float32), the start traced. The cache holds every block the chunk's
    queries see (``nsa_chunk_pallas``'s contract: the chunk's own blocks are written first)."""
    B, G, h, D, S = 2, 2, 3, 8, 240
    Tc = cfg.num_cmp_blocks(S)
    q, kc, vc = _cmp_inputs(start, B, C, G, h, D, Tc)
    lay = offset_layout(B, C, start, Tc, cfg.stride_d)
    o_want, l_want = cmp_forward(q, kc, vc, cfg, BlockSizes(), D ** -0.5, True, seg=lay)
    o, lse = jax.jit(lambda q, k, v, s: cmp_chunk_grouped(q, k, v, s, cfg, "xla", grouping))(
        q, kc, vc, jnp.int32(start))
    assert o.shape == o_want.shape and lse.shape == l_want.shape
    assert rel_err(o, o_want) <= 2e-6
    np.testing.assert_allclose(np.asarray(lse), np.asarray(l_want), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
def test_chunk_on_the_grouped_path_equals_the_jax_numpy_chunk(grouping):
    """``nsa_chunk_pallas`` with ``cmp_attn="xla"`` (the grouped compressed attention, then the
    Pallas scores, top-n, selection and window on its lse) equals the jax.numpy chunk."""
    q, lc, span, t, gates = chunk_inputs(2, SMALL, 2, 2, 3, 8, 32, 160, 16, 96)
    want = nsa_chunk_attention(q, lc, span, t, gates, SMALL)
    got = nsa_chunk_pallas(q, lc, span, t, gates, SMALL,
                           choices=KernelChoices(cmp_attn="xla", cmp_grouping=grouping))
    assert rel_err(got, want) <= 2e-5


def test_chunk_cmp_attn_rule():
    """"auto" keeps the Pallas kernels in interpret mode and for caches up to
    ``cmp_pallas_max_t``; an explicit "cudnn" that cannot run names the key."""
    q = jnp.zeros((1, 4, 2, 8), jnp.bfloat16)
    assert chunk_cmp_attn(KernelChoices(), q, q, 65536, interpret=True) == "pallas"
    assert chunk_cmp_attn(KernelChoices(), q, q, 4096, interpret=False) == "pallas"
    assert chunk_cmp_attn(KernelChoices(), q, q, 4097, interpret=False) == "cudnn"
    assert chunk_cmp_attn(KernelChoices(), q.astype(jnp.float32), q, 65536, False) == "pallas"
    assert chunk_cmp_attn(KernelChoices(cmp_attn="xla"), q, q, 16, interpret=True) == "xla"
    with pytest.raises(ValueError, match="kernel.cmp_attn"):
        chunk_cmp_attn(KernelChoices(cmp_attn="cudnn"), q, q, 65536, interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
def test_gpu_cudnn_chunk_matches_the_packed_kernel(grouping):
    """On the GPU at the 125M heads (h = 6, G = 2, 64-wide): a 1,024-query chunk at 15,360 over
    a 16,448-token cache on cuDNN (bf16) against the Pallas packed kernel on float32 inputs
    (IEEE dots): o within relative RMSE 5e-3, lse2 within 0.02 (bf16 logits)."""
    cfg = NSAConfig()
    B, G, h, D, C, S, start = 2, 2, 6, 64, 1024, 16448, 15360
    Tc = cfg.num_cmp_blocks(S)
    q, kc, vc = _cmp_inputs(11, B, C, G, h, D, Tc, jnp.bfloat16)
    lay = offset_layout(B, C, start, Tc, cfg.stride_d)
    f32 = [x.astype(jnp.float32) for x in (q, kc, vc)]
    o_want, l_want = cmp_forward(*f32, cfg, BlockSizes.for_shape(h, D, 4), D ** -0.5, False,
                                 choices=KernelChoices(f32_dot="ieee"), seg=lay)
    o, lse = jax.jit(lambda q, k, v, s: cmp_chunk_grouped(q, k, v, s, cfg, "cudnn", grouping))(
        q, kc, vc, jnp.int32(start))
    err = rel_err(o, o_want)
    print(f"cuDNN grouped chunk vs Pallas float32: o rel RMSE {err:.2e}, "
          f"lse2 max abs {float(jnp.max(jnp.abs(lse - l_want))):.2e}")
    assert err <= 5e-3
    np.testing.assert_allclose(np.asarray(lse), np.asarray(l_want), atol=0.02)
