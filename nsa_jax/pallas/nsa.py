"""``nsa_attention_pallas``: NSA attention (Eq. 5) from the Pallas kernels.

Branches: compressed attention (``compressed.cmp_attention``), block selection from the fused
scores (``compressed.cmp_block_scores`` + the reference's ``topn_from_scores``), selected-block
attention (``selection.selection_attention``) and the sliding window (``window``), gated and
summed like the reference (``reference.combine``). Kernels run compiled on a GPU and through
the Pallas interpreter elsewhere (``jax.default_backend()``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import reference
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import MIN_DOT, BlockSizes, next_pow2, use_interpret
from nsa_jax.pallas.compressed import cmp_attention, cmp_block_scores, cmp_forward
from nsa_jax.pallas.selection import selection_attention
from nsa_jax.pallas.window import window_attention


def _pad_dim(x, D: int):
    """Zero-pad the head dim to D (kernels use power-of-two head dims >= 16)."""
    if x.shape[-1] == D:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, D - x.shape[-1])])


def _padded_dims(Dk: int, Dv: int):
    return max(MIN_DOT, next_pow2(Dk)), max(MIN_DOT, next_pow2(Dv))


def _block_sizes(q, G: int, block_sizes):
    if block_sizes is not None:
        if not isinstance(block_sizes, BlockSizes):
            raise TypeError(f"block_sizes must be a BlockSizes, got {type(block_sizes).__name__}")
        return block_sizes
    return BlockSizes.for_shape(q.shape[2] // G, q.shape[-1])


def block_scores_pallas(q, k_cmp, cfg: NSAConfig, block_sizes: BlockSizes | None = None):
    """Selection-block scores [B,T,G,Ts] (Eq. 9-10), computed without materialising p_cmp."""
    q = jax.lax.stop_gradient(q)
    k_cmp = jax.lax.stop_gradient(k_cmp)
    G, Dk = k_cmp.shape[2], q.shape[-1]
    bs = _block_sizes(q, G, block_sizes)
    interpret = use_interpret()
    Dkp, _ = _padded_dims(Dk, Dk)
    qp, kp = _pad_dim(q, Dkp), _pad_dim(k_cmp, Dkp)
    scale = 1.0 / math.sqrt(Dk)
    _, lse = cmp_forward(qp, kp, None, cfg, bs, scale, interpret)
    return cmp_block_scores(qp, kp, lse, cfg, bs, scale, interpret)


def select_blocks_pallas(q, k_cmp, cfg: NSAConfig, block_sizes: BlockSizes | None = None):
    """Selected block ids int32 [B,T,G,n_sel], ascending, -1 padded (== reference.select_blocks)."""
    return reference.topn_from_scores(block_scores_pallas(q, k_cmp, cfg, block_sizes), cfg)


def nsa_attention_pallas(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg: NSAConfig,
                         block_idx=None, block_sizes: BlockSizes | None = None):
    """NSA attention output [B,T,Hq,Dv] in q's dtype; same contract as
    ``reference.nsa_attention_reference`` (``block_idx`` overrides the selection)."""
    B, T, Hq, Dk = q.shape
    G, Dv = k_slc.shape[2], v_slc.shape[-1]
    bs = _block_sizes(q, G, block_sizes)
    interpret = use_interpret()
    scale = 1.0 / math.sqrt(Dk)
    Dkp, Dvp = _padded_dims(Dk, Dv)
    qp = _pad_dim(q, Dkp)
    br = cfg.branches

    o_cmp = o_slc = o_win = None
    lse = None
    if "cmp" in br:
        kc = _pad_dim(k_cmp, Dkp)
        o_cmp, lse = cmp_attention(qp, kc, _pad_dim(v_cmp, Dvp), cfg, bs, scale, interpret)
        o_cmp = o_cmp[..., :Dv]
    if "slc" in br:
        idx = block_idx
        if idx is None:
            qs, kcs = jax.lax.stop_gradient(qp), jax.lax.stop_gradient(_pad_dim(k_cmp, Dkp))
            if lse is None:
                _, lse = cmp_forward(qs, kcs, None, cfg, bs, scale, interpret)
            scores = cmp_block_scores(qs, kcs, jax.lax.stop_gradient(lse), cfg, bs, scale,
                                      interpret)
            idx = reference.topn_from_scores(scores, cfg)
        idx = jax.lax.stop_gradient(jnp.asarray(idx, jnp.int32))
        o_slc = selection_attention(qp, _pad_dim(k_slc, Dkp), _pad_dim(v_slc, Dvp), idx, cfg, bs,
                                    scale, interpret)[..., :Dv]
    if "win" in br:
        o_win = window_attention(q, k_win, v_win, cfg, interpret)
    return reference.combine(o_cmp, o_slc, o_win, gates, cfg, q.dtype)
