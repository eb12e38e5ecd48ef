"""Causal attention over packed documents for the dense baseline model (``attention: dense`` with
``segment_ids``)."""
from __future__ import annotations

import math

import jax

from nsa_jax.nsa import semantics


def dense_packed_attention(q, k, v, segment_ids, impl: str):
    """Causal attention inside each document: q [B,T,H,D], k/v [B,T,G,D], segment_ids [B,T].

    ``pallas`` (the model's choice on a GPU): the document-local FlashAttention kernel
    (``nsa_jax.pallas.local``), no mask, O(T) memory, work only inside each document.
    ``xla`` (the model's choice elsewhere, or with ``exec.dense_impl: xla``): an explicit
    [B,1,T,T] same-document mask, O(T^2) memory.
    ``cudnn``: cuDNN's packed (THD) layout, one segment per document: per-row segment lengths
    and offsets [B, M] padded with -1, M = T; no [T, T] mask. NOT used by the model: on an H200
    with jax 0.11.2 its output was 0.90 (relative) away from the masked path (GPU test in
    tests/test_pallas_gpu.py, marked as a known failure) and the cause is not found yet."""
    if impl == "pallas":
        from nsa_jax.pallas.local import local_attention
        return local_attention(q, k, v, semantics.document_starts(segment_ids)).astype(q.dtype)
    if impl != "cudnn":
        mask = semantics.same_document(segment_ids, segment_ids)[:, None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                            implementation=impl)
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_attn
    lengths, offsets = semantics.packed_segments(semantics.document_positions(segment_ids))
    # sliding_window_length = T (no effective window): on an H200 with jax 0.11.2 the packed
    # layout without a window gave outputs 0.89 (relative) away from the masked reference, while
    # the same call with a window (the NSA window branch) matched it.
    return cudnn_attn(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
                      kv_offsets=offsets, scale=1.0 / math.sqrt(q.shape[-1]),
                      mask_type=MaskType.PADDING_CAUSAL, sliding_window_length=q.shape[1])
