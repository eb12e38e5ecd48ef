"""Flax NNX decoder-only language model with ``attention: nsa | dense``.

Layout: embedding -> N x [RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU -> residual]
-> RMSNorm -> LM head (tied to the embedding by default). Params are float32; activations use
``model.compute_dtype`` (bfloat16 on GPU). The attention modules (``NSAAttention``,
``DenseAttention``) are in :mod:`nsa_jax.attention_modules`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from nsa_jax import decode as kvcache
from nsa_jax.attention_modules import (DTYPES, DenseAttention, NSAAttention, _normal, on_gpu,
                                       resolve_nsa_impl)
from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.loss import chunked_cross_entropy
from nsa_jax.nsa import NSAConfig, semantics
from nsa_jax.swiglu import swiglu

__all__ = ["DTYPES", "Block", "DenseAttention", "NSAAttention", "NSALM", "SwiGLU", "build_model",
           "count_params", "lm_loss", "on_gpu", "resolve_nsa_impl"]


class SwiGLU(nnx.Module):
    def __init__(self, mcfg: ModelConfig, *, rngs: nnx.Rngs):
        dt = DTYPES[mcfg.compute_dtype]
        std = mcfg.init_std
        self.w_in = nnx.Linear(mcfg.dim, 2 * mcfg.mlp_hidden, use_bias=False, dtype=dt,
                               kernel_init=_normal(std), rngs=rngs)
        self.w_out = nnx.Linear(mcfg.mlp_hidden, mcfg.dim, use_bias=False, dtype=dt,
                                kernel_init=_normal(std / math.sqrt(2 * mcfg.n_layers)), rngs=rngs)

    def __call__(self, x):
        return self.w_out(swiglu(self.w_in(x)))


class Block(nnx.Module):
    def __init__(self, mcfg: ModelConfig, ncfg: NSAConfig, *, rngs: nnx.Rngs,
                 xcfg: ExecConfig | None = None):
        dt = DTYPES[mcfg.compute_dtype]
        self.norm1 = nnx.RMSNorm(mcfg.dim, epsilon=mcfg.norm_eps, dtype=dt, rngs=rngs)
        self.attn = (NSAAttention(mcfg, ncfg, rngs=rngs, xcfg=xcfg) if mcfg.attention == "nsa"
                     else DenseAttention(mcfg, rngs=rngs, xcfg=xcfg))
        self.norm2 = nnx.RMSNorm(mcfg.dim, epsilon=mcfg.norm_eps, dtype=dt, rngs=rngs)
        self.mlp = SwiGLU(mcfg, rngs=rngs)

    def __call__(self, x, positions, cache: kvcache.LayerCache | None = None, segment_ids=None):
        """-> (x, cache): the attention's cache passes through (None in training)."""
        a, cache = self.attn(self.norm1(x), positions, cache, segment_ids)
        x = x + a
        return x + self.mlp(self.norm2(x)), cache


class NSALM(nnx.Module):
    """Decoder-only LM. ``__call__(tokens [B,T]) -> hidden [B,T,dim]``; ``logits`` adds the head."""

    def __init__(self, mcfg: ModelConfig, ncfg: NSAConfig, *, rngs: nnx.Rngs,
                 xcfg: ExecConfig | None = None):
        self.mcfg, self.ncfg, self.xcfg = mcfg, ncfg, xcfg or ExecConfig()
        dt = DTYPES[mcfg.compute_dtype]
        self.dtype = dt
        self.embed = nnx.Embed(mcfg.vocab_size, mcfg.dim, dtype=dt,
                               embedding_init=_normal(mcfg.init_std), rngs=rngs)
        self.blocks = nnx.List([Block(mcfg, ncfg, rngs=rngs, xcfg=self.xcfg)
                                 for _ in range(mcfg.n_layers)])
        self.norm = nnx.RMSNorm(mcfg.dim, epsilon=mcfg.norm_eps, dtype=dt, rngs=rngs)
        if not mcfg.tie_embeddings:
            self.head = nnx.Linear(mcfg.dim, mcfg.vocab_size, use_bias=False, dtype=dt,
                                   kernel_init=_normal(mcfg.init_std), rngs=rngs)

    def __call__(self, tokens, positions=None, segment_ids=None):
        """tokens int [B,T] -> final hidden [B,T,dim].

        positions: [T] or [B,T] RoPE positions (default 0..T-1, or restarting at 0 in each
        document with ``segment_ids``). segment_ids: int32 [B,T], non-decreasing along each
        row, one id per document: packed documents, each attended as if alone (both
        ``attention: nsa`` and ``dense``).
        """
        T = tokens.shape[1]
        if segment_ids is not None:
            semantics.check_segment_ids(segment_ids, tokens.shape)
            segment_ids = jnp.asarray(segment_ids, jnp.int32)
        if positions is None:
            positions = (jnp.arange(T) if segment_ids is None
                         else semantics.document_positions(segment_ids))
        x = self.embed(tokens)
        for blk in self.blocks:
            if self.xcfg.remat == "block":
                x = nnx.remat(lambda b, y, p, s: b(y, p, None, s)[0])(blk, x, positions,
                                                                       segment_ids)
            else:
                x = blk(x, positions, None, segment_ids)[0]
        return self.norm(x)

    def extend(self, tokens, cache, lengths=None, start=None):
        """Run tokens [B,S] through the model with KV caches (:mod:`nsa_jax.decode`).

        S == 1 (no ``start``): one decode step, row b's token at position ``cache["pos"][b]``.
        S > 1: prefill of an empty cache; row b holds ``lengths[b]`` valid tokens (default S),
        right-padded. ``start`` (int32 scalar; a multiple of ``nsa.sel_block``, > 0): a
        continuation chunk of a chunked prefill, the tokens at positions start .. start+S-1 of
        prompts of ``lengths[b]`` tokens in all (row b takes ``clip(lengths[b] - start, 0, S)``
        of them; its cache holds its first ``start`` tokens, or all of them when shorter).
        Returns (final hidden [B,S,dim], cache with ``pos`` advanced by the valid tokens).
        """
        B, S = tokens.shape
        pos = cache["pos"]
        full = jnp.full((B,), S, jnp.int32)
        if start is not None:
            start = jnp.asarray(start, jnp.int32)
            positions = start + jnp.arange(S, dtype=jnp.int32)
            total = full + start if lengths is None else jnp.asarray(lengths, jnp.int32)
            n = jnp.clip(total - start, 0, S)
        elif S == 1:
            positions, n = pos[:, None], jnp.ones((B,), jnp.int32)
        else:
            positions = jnp.arange(S)
            n = full if lengths is None else jnp.asarray(lengths, jnp.int32)
        x = self.embed(tokens)
        layers = []
        for blk, kv in zip(self.blocks, cache["layers"]):
            x, lc = blk(x, positions, kvcache.LayerCache(kv=kv, pos=pos, n=n, start=start))
            layers.append(lc.kv)
        return self.norm(x), {"pos": pos + n, "layers": layers}

    def head_logits(self, h):
        if self.mcfg.tie_embeddings:
            return self.embed.attend(h)
        return self.head(h)

    def logits(self, tokens, positions=None, segment_ids=None):
        return self.head_logits(self(tokens, positions, segment_ids)).astype(jnp.float32)


def lm_loss(model: NSALM, tokens, loss_mask=None, segment_ids=None):
    """Mean next-token cross-entropy. tokens [B, T+1]: inputs tokens[:, :-1], targets tokens[:, 1:].

    ``loss_mask`` [B, T] weights the targets. ``segment_ids`` [B, T+1] packs documents: the
    model sees ``segment_ids[:, :-1]`` and a target from another document than its input (the
    first token of the next document) does not count, so each document's loss is its loss
    alone. Uses :func:`chunked_cross_entropy` with ``model.loss_chunk`` tokens per chunk."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seg = None
    if segment_ids is not None:
        semantics.check_segment_ids(segment_ids, tokens.shape)
        seg = segment_ids[:, :-1]
        same = (segment_ids[:, 1:] == seg).astype(jnp.float32)
        loss_mask = same if loss_mask is None else loss_mask * same
    h = model(inputs, segment_ids=seg)
    if model.mcfg.tie_embeddings:
        w_out = model.embed.embedding[...].T
    else:
        w_out = model.head.kernel[...]
    total, count = chunked_cross_entropy(h, w_out, targets, min(model.mcfg.loss_chunk, h.shape[1]),
                                         loss_mask)
    return total / jnp.maximum(count, 1.0)


def build_model(mcfg: ModelConfig, ncfg: NSAConfig, seed: int = 0,
                exec_cfg: ExecConfig | None = None) -> NSALM:
    return NSALM(mcfg, ncfg, rngs=nnx.Rngs(params=seed), xcfg=exec_cfg)


def count_params(model) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
