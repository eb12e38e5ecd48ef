"""One decode step of the whole model on the Pallas decode path, with each residual add and the
RMSNorm after it as one kernel (``pallas.add_norm``).

The same function as :meth:`nsa_jax.model.NSALM.extend` over :meth:`nsa_jax.model.Block.__call__`
(``x = x + attn(norm1(x)); x = x + mlp(norm2(x))`` per block, then the final norm), regrouped so
that every add meets the norm that reads its result: each block's MLP output is carried to the
next block (or the final norm) unadded, and ``add_rms_norm`` forms the sum and the normalised
row together. Per layer that is two kernels where XLA ran six (two adds, two norms of two kernels
each; bench/NOTES.md, nineteenth session). NSA and dense blocks alike (a fair comparison).
"""
from __future__ import annotations

from nsa_jax import decode as kvcache
from nsa_jax.pallas.add_norm import add_rms_norm


def _add_norm(x, a, norm):
    B, _, D = x.shape
    s, h = add_rms_norm(x.reshape(B, D), None if a is None else a.reshape(B, D),
                        norm.scale[...], eps=norm.epsilon, dtype=norm.dtype)
    return s.reshape(B, 1, D), h.reshape(B, 1, D)


def fused_step(model, x, pos, n, layers):
    """x [B,1,dim] (the embedded tokens) at positions ``pos`` [B] through every block with the
    caches ``layers`` -> (final hidden [B,1,dim], the blocks' updated caches)."""
    pending, out = None, []
    for blk, kv in zip(model.blocks, layers):
        x, h = _add_norm(x, pending, blk.norm1)
        a, lc = blk.attn(h, pos[:, None], kvcache.LayerCache(kv=kv, pos=pos, n=n))
        x, h = _add_norm(x, a, blk.norm2)
        pending = blk.mlp(h)
        out.append(lc.kv)
    return _add_norm(x, pending, model.norm)[1], out
