"""Compressed attention (NSA §3.3.1, Eq. 7-8 applied) as a plain causal attention, so that a
fused dense-attention library (cuDNN) can run its matmuls (``KernelChoices.cmp_attn``).

Query t sees compressed block i iff i*d + l - 1 <= t (``semantics.cmp_visible``), i.e.
i <= c(t) = floor((t - l + 1) / d) for t >= l - 1 and nothing before. The d consecutive queries
t = l - 1 + c*d + r (r < d) share c, so moving r into the head axis gives a causal attention over
the compressed sequence: query row c (heads ordered (group g, head i, r), GQA ratio h*d) sees
keys i <= c. Rows past the last query and keys past Tc are padding (a query row c < Tc never sees
a key >= Tc under the causal mask; padded query rows are dropped). Queries t < l - 1 get o = 0
and lse = +inf, as in the Pallas kernels.

Returns o (float32) and the base-2 log-sum-exp of the scaled logits (the selection scores,
Eq. 9, need it; not differentiated). Two implementations:

* ``"cudnn"``: cuDNN fused attention, forward and backward (``return_residual`` gives the
  natural-log lse, converted to base 2). GPU, bf16/fp16, head dims <= 128 and multiples of 8.
* ``"xla"``: the same grouping with explicit [Tc, Tc] logits in XLA (O(Tc^2) memory): the CPU
  twin that the tests use to check the grouping; also a fallback where cuDNN is unavailable.

Cost: the attention itself is causal over Tc keys with Hq*d query heads, the same FLOPs as the
Pallas kernels. Two head orders (``KernelChoices.cmp_grouping``):

* ``"transpose"``: heads (g, i, r), so each KV group's h*d query heads are consecutive, as GQA
  wants, and the keys are used as they are; the grouping copies q (and o, dq, dO in the
  backward) through a transpose (on an H200 at 8k / B=4, 125M: ~0.96 ms of a 107 ms train step;
  bench/NOTES.md, fifty-second session).
* ``"repeat"``: heads (r, g, i), which is q's own memory order, so grouping and ungrouping are
  reshapes; instead each compressed key is repeated d times (KV heads (r, g), GQA ratio h), a
  copy of Tc*d*G keys (1/h of q's size), and its gradient summed over r.

A continuation chunk of a chunked prefill (:func:`cmp_chunk_grouped`, forward only): its
queries' grouped rows see every block before the first of them and, causally, their own; two
plain attentions merged by their log-sum-exps.

Packed documents (``seg``: a ``semantics.SegmentLayout``): document k's blocks sit in the slots
[off_k, off_k + Tc(L_k)), and the query at document-relative r = l - 1 + c*d + rr sees slots
off_k .. off_k + c. So query row R = off_k + c (the row of slot R) holds the d queries
cmp_src[R] + l - 1 + rr, and it sees the slots lo(R) <= s <= R: a causal attention over the slots
restricted to one document. The rows are gathered (not transposed) from the tokens, each slot row
taking its document's queries, and the attention gets the [Tq, Tq] document mask of the slots
(cuDNN: as a bias; O(Tc^2) = O(T^2/d^2), 32 MB at T = 64k with d = 16). Grouping and ungrouping
are a partial permutation of (token, head) entries and its inverse, so their transposes (the
backward) are the inverse gathers: :func:`_permute`, no scatter.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import CMP_GROUPINGS as GROUPINGS   # KernelChoices.cmp_grouping
from nsa_jax.pallas.common import LOG2E, POS_INF

CUDNN_ALIGN = 64  # the compressed sequence is padded to a multiple of this for cuDNN


def _grouped_len(T: int, cfg: NSAConfig, align: int) -> int:
    Tc = cfg.num_cmp_blocks(T)
    return -(-Tc // align) * align


def _to_rows(x, G: int, d: int, grouping: str):
    """[B, R*d, Hq, D] (row c's d queries consecutive) -> [B, R, Hq*d, D] in the grouping's head
    order: "transpose" (g, i, r), a transpose; "repeat" (r, g, i), a reshape."""
    B, n, Hq, D = x.shape
    R = n // d
    if grouping == "repeat":
        return x.reshape(B, R, d * Hq, D)
    x = x.reshape(B, R, d, G, Hq // G, D).transpose(0, 1, 3, 4, 2, 5)
    return x.reshape(B, R, Hq * d, D)


def _from_rows(x, G: int, d: int, grouping: str):
    """Inverse of :func:`_to_rows` for per-query values x [B, R, Hq*d, ...] -> [B, R*d, Hq, ...]."""
    B, R, N = x.shape[:3]
    Hq, rest = N // d, x.shape[3:]
    if grouping == "repeat":
        return x.reshape(B, R * d, Hq, *rest)
    y = x.reshape(B, R, G, Hq // G, d, *rest)
    return jnp.moveaxis(y, 4, 2).reshape(B, R * d, Hq, *rest)


def group_keys(k, d: int, grouping: str):
    """The keys (or values) [B, n, G, D] of grouped rows in the grouping's KV-head order:
    "transpose" as they are (query heads (g, i, r), GQA ratio h*d); "repeat" each repeated d
    times, heads (r, g) (query heads (r, g, i), GQA ratio h), so that query head (r, g, i)
    reads KV head r*G + g, a copy of k's head g."""
    if grouping != "repeat":
        return k
    B, n, G, D = k.shape
    return jnp.broadcast_to(k[:, :, None], (B, n, d, G, D)).reshape(B, n, d * G, D)


def group_queries(q, cfg: NSAConfig, G: int, Tq: int, grouping: str = "transpose"):
    """q [B,T,Hq,D] -> [B,Tq,Hq*d,D]: row c holds queries l-1 + c*d + r, heads (g, i, r)
    ("transpose") or (r, g, i) ("repeat")."""
    B, T, Hq, D = q.shape
    d, l = cfg.stride_d, cfg.block_l
    x = q[:, l - 1:]
    x = jnp.pad(x, ((0, 0), (0, Tq * d - x.shape[1]), (0, 0), (0, 0)))
    return _to_rows(x, G, d, grouping)


def ungroup(x, T: int, cfg: NSAConfig, G: int, fill, grouping: str = "transpose"):
    """Inverse of :func:`group_queries` for per-query values x [B,Tq,Hq*d,...] -> [B,T,Hq,...];
    queries t < l - 1 get ``fill``."""
    B = x.shape[0]
    l = cfg.block_l
    y = _from_rows(x, G, cfg.stride_d, grouping)[:, :T - (l - 1)]
    front = jnp.full((B, l - 1, *y.shape[2:]), fill, x.dtype)
    return jnp.concatenate([front, y], axis=1)


def _packed_maps(seg, T: int, Tq: int, cfg: NSAConfig):
    """Index maps of the packed grouping (module docstring), per batch row:
    ``tok`` [B, Tq*d] token of grouped query j = R*d + rr and ``tok_ok`` (a real query);
    ``row`` [B, T] grouped index of token t and ``row_ok`` (t sees a block: r(t) >= l - 1);
    ``lo`` [B, Tq] first slot row R may see (R itself for padding rows)."""
    d, l = cfg.stride_d, cfg.block_l
    Tc = seg.cmp_src.shape[1]
    pad = Tq - Tc
    src = jnp.pad(seg.cmp_src, ((0, 0), (0, pad)))
    ok = jnp.pad(seg.cmp_ok, ((0, 0), (0, pad)))
    tok = src[:, :, None] + (l - 1) + jnp.arange(d, dtype=jnp.int32)            # [B,Tq,d]
    tok_c = jnp.minimum(tok, T - 1)
    start_tok = jnp.take_along_axis(seg.start, tok_c.reshape(tok.shape[0], -1), axis=1)
    start_src = jnp.take_along_axis(seg.start, src, axis=1)
    tok_ok = (ok[:, :, None] & (tok < T)
              & (start_tok.reshape(tok.shape) == start_src[:, :, None]))
    rel = seg.rel - (l - 1)
    row_ok = rel >= 0
    relc = jnp.maximum(rel, 0)
    row = (seg.cmp_lo + relc // d) * d + relc % d
    R = jnp.arange(Tq, dtype=jnp.int32)
    lo_src = jnp.take_along_axis(seg.cmp_lo, src, axis=1)
    lo = jnp.where(ok, lo_src, R)
    B = tok.shape[0]
    return (tok_c.reshape(B, Tq * d), tok_ok.reshape(B, Tq * d),
            jnp.where(row_ok, row, 0), row_ok, lo)


@jax.custom_vjp
def _permute(x, idx, ok, inv, inv_ok):
    """y[b, j] = x[b, idx[b, j]] where ok[b, j], else 0 (x [B, N, ...]): a partial permutation
    whose inverse is (inv, inv_ok); its transpose is therefore the inverse gather."""
    y = jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)
    return jnp.where(ok.reshape(ok.shape + (1,) * (x.ndim - 2)), y, jnp.zeros((), x.dtype))


def _permute_fwd(x, idx, ok, inv, inv_ok):
    return _permute(x, idx, ok, inv, inv_ok), (idx, ok, inv, inv_ok)


def _permute_bwd(res, g):
    idx, ok, inv, inv_ok = res
    return (_permute(g, inv, inv_ok, idx, ok), None, None, None, None)


_permute.defvjp(_permute_fwd, _permute_bwd)


def _pad_keys(k, Tq: int):
    return jnp.pad(k, ((0, 0), (0, Tq - k.shape[1]), (0, 0), (0, 0)))


def _grouped_kv(k, v, Tq: int, d: int, grouping: str):
    """The compressed keys and values [B,Tc,G,D] padded to Tq rows, in the grouping's KV heads."""
    return (group_keys(_pad_keys(k, Tq), d, grouping), group_keys(_pad_keys(v, Tq), d, grouping))


def _xla_causal(qg, k, v, scale: float, precision, lo=None):
    """Causal GQA attention with its base-e lse: qg [B,Tq,N,D], k/v [B,Tq,G,D]; ``lo`` [B,Tq]:
    row c sees only keys lo[c] <= i (packed documents)."""
    B, Tq, N, D = qg.shape
    G = k.shape[2]
    qh = qg.reshape(B, Tq, G, N // G, D).astype(jnp.float32)
    s = jnp.einsum("bcgjd,bigd->bgjci", qh, k.astype(jnp.float32), precision=precision) * scale
    c = jnp.arange(Tq)
    vis = c[None, :] <= c[:, None]                                        # [c, i]
    if lo is not None:
        vis = (vis[None] & (c[None, None, :] >= lo[:, :, None]))[:, None, None]  # [B,1,1,c,i]
    p = semantics.masked_softmax(s, vis)
    o = jnp.einsum("bgjci,bigd->bcgjd", p, v.astype(jnp.float32), precision=precision)
    lse = jax.nn.logsumexp(jnp.where(vis, jax.lax.stop_gradient(s), -jnp.inf), axis=-1)
    return o.reshape(B, Tq, N, v.shape[-1]), lse.transpose(0, 3, 1, 2).reshape(B, Tq, N)


def _cudnn_causal(qg, k, v, scale: float, lo=None):
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_attn
    k, v = k.astype(qg.dtype), v.astype(qg.dtype)
    mask = None
    if lo is not None:   # packed: row c sees keys lo[c] <= i (the causal half is the mask type)
        i = jnp.arange(qg.shape[1], dtype=lo.dtype)
        mask = (i[None, None, :] >= lo[:, :, None])[:, None]                 # [B,1,Tq,Tq]
    o, lse = cudnn_attn(qg, k, v, mask=mask, scale=scale, mask_type=MaskType.CAUSAL,
                        return_residual=True)
    # the residual is [B, N, Tq] (softmax statistics of the BTNH call), natural log
    return o.astype(jnp.float32), jnp.swapaxes(jax.lax.stop_gradient(lse), 1, 2)


def cmp_attention_grouped(q, k_cmp, v_cmp, cfg: NSAConfig, impl: str, precision=None,
                          seg: semantics.SegmentLayout | None = None,
                          grouping: str = "transpose"):
    """q [B,T,Hq,Dk], k_cmp/v_cmp [B,Tc,G,D] -> (o_cmp float32 [B,T,Hq,Dv], lse2 float32
    [B,T,Hq]: base-2 log-sum-exp of the scaled logits, +inf where no block is visible).
    Differentiable in q, k_cmp, v_cmp through o_cmp (lse2 is not). ``precision``: XLA matmul
    precision of the ``"xla"`` path's float32 einsums. ``seg``: packed rows' layout (module
    docstring; None = one document per row). ``grouping``: the grouped rows' head order
    (``KernelChoices.cmp_grouping``: :func:`group_keys`)."""
    B, T, Hq, Dk = q.shape
    Tc, G = k_cmp.shape[1], k_cmp.shape[2]
    Dv = v_cmp.shape[-1]
    if Tc == 0:
        return (jnp.zeros((B, T, Hq, Dv), jnp.float32),
                jnp.full((B, T, Hq), POS_INF, jnp.float32))
    if impl not in ("cudnn", "xla"):
        raise ValueError(f"impl must be 'cudnn' or 'xla', got {impl!r}")
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {list(GROUPINGS)}, got {grouping!r}")
    Tq = _grouped_len(T, cfg, CUDNN_ALIGN if impl == "cudnn" else 1)
    if seg is not None:
        return _packed(q, k_cmp, v_cmp, cfg, impl, precision, seg, Tq, grouping)
    qg = group_queries(q, cfg, G, Tq, grouping)
    kp, vp = _grouped_kv(k_cmp, v_cmp, Tq, cfg.stride_d, grouping)
    scale = 1.0 / math.sqrt(Dk)
    if impl == "cudnn":
        og, lse = _cudnn_causal(qg, kp, vp, scale)
    else:
        og, lse = _xla_causal(qg, kp, vp, scale, precision)
    return (ungroup(og, T, cfg, G, 0.0, grouping),
            ungroup(lse * LOG2E, T, cfg, G, POS_INF, grouping))


def _packed(q, k_cmp, v_cmp, cfg: NSAConfig, impl: str, precision, seg, Tq: int,
            grouping: str):
    """The packed grouping (module docstring): gather the slot rows, attend causally within each
    document's slots, gather the tokens back."""
    B, T, Hq, Dk = q.shape
    G, d = k_cmp.shape[2], cfg.stride_d
    tok, tok_ok, row, row_ok, lo = _packed_maps(seg, T, Tq, cfg)
    qg = _to_rows(_permute(q, tok, tok_ok, row, row_ok), G, d, grouping)   # [B,Tq,Hq*d,D]
    kp, vp = _grouped_kv(k_cmp, v_cmp, Tq, d, grouping)
    scale = 1.0 / math.sqrt(Dk)
    if impl == "cudnn":
        og, lse = _cudnn_causal(qg, kp, vp, scale, lo)
    else:
        og, lse = _xla_causal(qg, kp, vp, scale, precision, lo)

    def back(x, fill):   # [B,Tq,Hq*d,...] -> [B,T,Hq,...]
        y = _permute(_from_rows(x, G, d, grouping), row, row_ok, tok, tok_ok)
        ok = row_ok.reshape(row_ok.shape + (1,) * (y.ndim - 2))
        return y if fill == 0.0 else jnp.where(ok, y, fill)

    return back(og, 0.0), back(jax.lax.stop_gradient(lse) * LOG2E, POS_INF)


def _plain(qg, k, v, scale: float, impl: str, kv_len=None):
    """One GQA attention through ``jax.nn.dot_product_attention`` with its lse (natural log,
    [B, rows, N]): causal (top-left) when ``kv_len`` is None, else every row over the first
    ``kv_len`` [B] keys. ``impl``: "cudnn" or "xla" (the same call on XLA)."""
    o, lse = jax.nn.dot_product_attention(
        qg, k.astype(qg.dtype), v.astype(qg.dtype), scale=scale, is_causal=kv_len is None,
        key_value_seq_lengths=kv_len, implementation=impl, return_residual=True)
    return o.astype(jnp.float32), jax.lax.stop_gradient(lse).astype(jnp.float32)


def cmp_chunk_grouped(q, k_cmp, v_cmp, start, cfg: NSAConfig, impl: str,
                      grouping: str = "transpose"):
    """A continuation chunk's compressed attention (Eq. 7-8 applied; forward only) as two plain
    attentions in the grouped layout (module docstring), so that cuDNN can run them.

    q [B,C,Hq,Dk] at positions start .. start + C - 1 (start a multiple of d, >= l; traced),
    k_cmp / v_cmp [B,Tc,G,D]: the cache's compressed keys, those the chunk's queries may see
    already written. -> (o float32 [B,C,Hq,Dv], lse2 float32 [B,C,Hq], base 2).

    Query t = l - 1 + c*d + r sits in grouped row c and sees blocks i <= c. The chunk's rows
    are c0 .. c0 + R - 1 (its first query at r0 = (1 - l) mod d of row c0, the same for every
    chunk since start mod d = 0). Every row sees blocks i < c0 (part A: a plain attention over
    the first c0 keys, their count traced as the keys' sequence length) and, of the blocks from
    c0 on, those up to its own (part B: a causal attention of the R rows over keys c0 ..
    c0 + R - 1, a slice of the keys at a traced offset). The two parts are merged by their
    log-sum-exps. Grouped rows before the chunk's first query and past its last are padding,
    dropped on the way back. ``grouping``: as :func:`cmp_attention_grouped`'s."""
    B, C, Hq, Dk = q.shape
    Tc, G = k_cmp.shape[1], k_cmp.shape[2]
    d, l = cfg.stride_d, cfg.block_l
    if impl not in ("cudnn", "xla"):
        raise ValueError(f"impl must be 'cudnn' or 'xla', got {impl!r}")
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {list(GROUPINGS)}, got {grouping!r}")
    align = CUDNN_ALIGN if impl == "cudnn" else 1
    r0 = (1 - l) % d
    R = -(-(r0 + C) // d)
    R = -(-R // align) * align
    start = jnp.asarray(start, jnp.int32)
    c0 = (start - (l - 1) - r0) // d
    x = jnp.pad(q, ((0, 0), (r0, R * d - r0 - C), (0, 0), (0, 0)))
    qg = _to_rows(x, G, d, grouping)
    scale = 1.0 / math.sqrt(Dk)
    nk = -(-Tc // align) * align
    ka, va = _pad_keys(k_cmp, nk + R), _pad_keys(v_cmp, nk + R)   # part B may run past Tc

    def keys(x):
        return group_keys(x, d, grouping)

    o_b, lse_b = _plain(qg, keys(jax.lax.dynamic_slice_in_dim(ka, c0, R, 1)),
                        keys(jax.lax.dynamic_slice_in_dim(va, c0, R, 1)), scale, impl)
    o_a, lse_a = _plain(qg, keys(ka[:, :nk]), keys(va[:, :nk]), scale, impl,
                        kv_len=jnp.broadcast_to(jnp.maximum(c0, 1), (B,)))
    # no block before the chunk's first row (c0 = 0): part A is empty (its call saw one key)
    has_a = c0 > 0
    lse_a = jnp.where(has_a, lse_a, -jnp.inf)
    lse = jnp.logaddexp(lse_a, lse_b)
    o = (jnp.where(has_a, o_a, 0.0) * jnp.exp(lse_a - lse)[..., None]
         + o_b * jnp.exp(lse_b - lse)[..., None])

    def back(x):   # [B,R,Hq*d,...] -> the chunk's [B,C,Hq,...]
        return _from_rows(x, G, d, grouping)[:, r0:r0 + C]

    return back(o), back(lse * LOG2E)
