"""Document-local attention as a FlashAttention-2 kernel: causal attention restricted to each
query's document and, optionally, a sliding window.

Query t (document start ``start[b, t]``) sees key s iff start(t) <= s <= t and, with a window w,
s > t - w (``semantics.window_visible``). Two users:

* the NSA sliding-window branch of packed rows (§3.3.3; keys t - w < s <= t of t's document),
  ``window.window_attention`` with ``seg``; also float32 inputs on a GPU, where cuDNN does not
  apply;
* the dense model's attention over packed documents (``dense_packed.dense_packed_attention``, no
  window): causal attention inside each document without a [T, T] mask.

Kernels (``start`` int32 [B,T] non-decreasing along a row, as document starts are):

* forward and dQ: one program per (query head, batch, tile of ``bs.win_q`` queries); GQA: head ->
  group head // h. The program walks only the key tiles of ``bs.win_keys`` keys that can hold a
  visible key: from max(min start of its rows, first query - w + 1) to its last query. Logits in
  base 2 with an online softmax (forward) or P recomputed from the saved lse (dQ).
* dK/dV: one program per (KV group, batch, key tile) walks the query tiles that can see its keys
  (up to the last token of the last key's document, ``doc_last``, and within w of the last key)
  times the group's h heads as one loop of (tile, head) pairs, accumulating in registers; one
  plain store per key tile (no atomics). Logits keys-first (s^T = K Q^T,
  ``common.dkv_accumulate_t``): packed 64k / 8k, dK/dV -19% / -20% on an H100 (bench/NOTES.md,
  twenty-third session).

Key tiles (forward, dQ) or query tiles (dK/dV) that every row of the program's tile sees in full
(``_full_tiles``, ``_full_query_tiles``) run a second loop without the bounds and visibility masks:
on an H200 a dense continuation chunk over a 48k prefix 13.5 -> 8.8 ms, and in the packed 125M op
at 64k the forward 0.51 -> 0.41, dQ 0.61 -> 0.52, dK/dV 1.10 -> 1.01 ms (bench/NOTES.md,
forty-eighth session).

Work is O(T * (w + tile)) with a window and O(sum of squared document lengths / 2) without one
(plus the tiles that straddle documents), never O(T^2) for short documents; memory is O(T).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa import semantics
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas.common import (LOG2E, NEG_INF, BlockSizes, cdiv, choices_or_default,
                                   compiler_params, dkv_accumulate_t, dot, dot_precision, dscores,
                                   grad_rows, idiv, load, pad_dim, padded_dims, probs,
                                   softmax_finish, softmax_init, softmax_step, store,
                                   use_interpret)


def doc_last(start) -> jax.Array:
    """int32 [B,T]: the last token of each token's document, from the document starts [B,T]."""
    B, T = start.shape
    t = jnp.arange(T, dtype=jnp.int32)
    last = jnp.concatenate([start[:, 1:] != start[:, :-1], jnp.ones((B, 1), bool)], axis=1)
    return lax.cummin(jnp.where(last, t, T - 1), axis=1, reverse=True)


def _span(window: int | None, T: int) -> int:
    """The window as a static int (no window: T + 1, which every key satisfies)."""
    return T + 1 if window is None else int(window)


def _rows(qt, bq: int, T: int):
    t = qt * bq + jnp.arange(bq)
    return t, t < T


def _visible(t, kpos, st, w: int, T: int, keys_first: bool = False):
    """[bq, bk] bool (``keys_first``: [bk, bq]): key kpos visible to query t (document start st)
    under window w."""
    if keys_first:
        return semantics.window_visible(t[None, :], kpos[:, None], w, st[None, :]) \
            & (kpos < T)[:, None]
    return semantics.window_visible(t[:, None], kpos[None, :], w, st[:, None]) \
        & (kpos < T)[None, :]


def _key_tiles(qt, st, bq: int, bk: int, w: int, T: int, off=0):
    """(first key tile, number of key tiles) that can hold a key visible to query tile qt (its
    first query at position ``off + qt * bq``; T keys)."""
    lo = jnp.maximum(jnp.maximum(jnp.min(st), off + qt * bq - (w - 1)), 0)
    hi = jnp.minimum(off + qt * bq + bq, T)
    k0 = idiv(lo, bk)
    return k0, idiv(hi + (bk - 1), bk) - k0


def _full_tiles(qt, st, bq: int, bk: int, w: int, off, k0, nk):
    """Key tiles [f0, f1) inside [k0, k0 + nk) whose every key every row of query tile qt (at
    positions off + qt*bq ..) sees: past the latest document start and the last row's window
    edge, up to the first row's position; f0 = f1 where there are none. The forward walks them
    without a mask (the rest of its tiles keep it)."""
    p0 = off + qt * bq
    lo = jnp.maximum(jnp.max(st), p0 + bq - 1 - (w - 1))    # first key all rows see
    f0 = jnp.maximum(idiv(lo + (bk - 1), bk), k0)
    f1 = jnp.minimum(idiv(p0 + 1, bk), k0 + nk)               # tiles ending at or before p0
    return f0, jnp.maximum(f1, f0)


def _full_query_tiles(last_ref, b, kt, bk: int, bq: int, w: int, T: int, q0, nq):
    """Query tiles [q0 + e0, q0 + e1) (as offsets e0 <= e1 in [0, nq]) whose every row sees every
    key of key tile kt: each row at or past its last key, inside T, inside the first key's
    document (up to ``last_ref``, that document's last token) and within the window of the first
    key (rows past the last key and inside the first key's document put the whole key tile in
    that document and inside T). The dK/dV kernel walks them without a mask."""
    k_first, k_last = kt * bk, kt * bk + (bk - 1)
    dl = last_ref[b, jnp.minimum(k_first, T - 1)]
    lo = jnp.clip(idiv(k_last + (bq - 1), bq) - q0, 0, nq)
    hi = jnp.minimum(jnp.minimum(idiv(dl + 1, bq), idiv(k_first + w, bq)), T // bq) - q0
    return lo, jnp.clip(hi, lo, nq)


def _q_program(T: int, bq: int):
    """(head, batch, query tile) on grid (Hq, B, n_tiles); tiles last to first (without a window
    the last tiles of a long document are the longest programs: they start first)."""
    return pl.program_id(0), pl.program_id(1), cdiv(T, bq) - 1 - pl.program_id(2)


# ---- forward -----------------------------------------------------------------------------------
def _fwd_kernel(start_ref, *refs, h, bq, bk, w, scale, prec, offset=False):
    if offset:    # query row i is at key position off + i (a continuation chunk)
        off_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
        off = off_ref[0]
    else:
        (q_ref, k_ref, v_ref, o_ref, lse_ref), off = refs, 0
    T, Tk, Dv = q_ref.shape[1], k_ref.shape[1], v_ref.shape[-1]
    hd, b, qt = _q_program(T, bq)
    g = idiv(hd, h)
    t, ok = _rows(qt, bq, T)
    rows = pl.ds(qt * bq, bq)
    q = load(q_ref.at[b, rows, hd, :], ok[:, None])
    st = load(start_ref.at[b, rows], ok, other=Tk)  # padding rows: start past the keys, see none
    k0, nk = _key_tiles(qt, st, bq, bk, w, Tk, off)
    # (fewer keys than a tile: no full tile, and an unmasked load of bk keys would not fit)
    f0, f1 = _full_tiles(qt, st, bq, bk, w, off, k0, nk) if Tk >= bk else (k0, k0)
    c = scale * LOG2E

    def body(kt, carry, masked=True):
        m, lsum, acc = carry
        kpos = kt * bk + jnp.arange(bk)
        if masked:
            kok = kpos < Tk
            k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
            v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
        else:           # a full tile lies before the first row's position: inside the keys
            k, v = k_ref[b, pl.ds(kt * bk, bk), g, :], v_ref[b, pl.ds(kt * bk, bk), g, :]
        s = dot(q, k, trans_b=True, precision=prec)
        if masked:
            s = jnp.where(_visible(off + t, kpos, st, w, Tk), s, NEG_INF)
        m, alpha, p, lsum = softmax_step(m, lsum, s, c)
        return m, lsum, acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)

    carry = lax.fori_loop(k0, f0, body, softmax_init(bq, Dv))
    if Tk >= bk:
        carry = lax.fori_loop(f0, f1, functools.partial(body, masked=False), carry)
    m, lsum, acc = lax.fori_loop(f1, k0 + nk, body, carry)
    l_safe, lse = softmax_finish(m, lsum)
    t_st = jnp.where(ok, t, T)  # masked rows -> out of bounds (dropped)
    dv_ = jnp.arange(Dv)
    store(o_ref.at[b, t_st[:, None], hd, dv_[None, :]], acc / l_safe[:, None], ok[:, None])
    store(lse_ref.at[b, t_st, hd], lse, ok)


def local_forward(q, k, v, start, window: int | None, bs: BlockSizes, scale: float,
                  interpret: bool, *, choices: KernelChoices | None = None, offset=None):
    """q [B,T,Hq,Dk], k/v [B,T,G,D] (power-of-two head dims >= 16), start int32 [B,T] -> o float32
    [B,T,Hq,Dv], lse2 float32 [B,T,Hq] (base-2 log-sum-exp of the scaled logits).

    ``offset`` (int32 [1], traced; forward only): query row i sits at key position offset + i
    of k/v [B,Tk,G,D] (Tk >= offset + T), and ``start`` / ``window`` apply at that position: a
    continuation chunk's queries over keys before them (``pallas.chunk``)."""
    B, T, Hq, _ = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    kern = functools.partial(_fwd_kernel, h=Hq // G, bq=bs.win_q, bk=bs.win_keys,
                             w=_span(window, k.shape[1]), scale=scale,
                             prec=dot_precision(q.dtype, interpret, choices),
                             offset=offset is not None)
    return pl.pallas_call(
        kern, grid=(Hq, B, cdiv(T, bs.win_q)),
        out_shape=[jax.ShapeDtypeStruct((B, T, Hq, Dv), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, Hq), jnp.float32)],
        compiler_params=compiler_params(bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_local_fwd",
    )(start, *(() if offset is None else (jnp.asarray(offset, jnp.int32).reshape(1),)), q, k, v)


# ---- backward: dQ ------------------------------------------------------------------------------
def _dq_kernel(start_ref, q_ref, k_ref, v_ref, do_ref, gs_ref, lse_ref, delta_ref, dq_ref, *, h,
               bq, bk, w, scale, prec):
    T, Dk = q_ref.shape[1], q_ref.shape[-1]
    hd, b, qt = _q_program(T, bq)
    g = idiv(hd, h)
    cdt = q_ref.dtype
    t, ok = _rows(qt, bq, T)
    rows = pl.ds(qt * bq, bq)
    q, do, gs, lse, delta = grad_rows(q_ref, do_ref, gs_ref, lse_ref, delta_ref,
                                      b, rows, hd, ok, cdt)
    st = load(start_ref.at[b, rows], ok, other=T)
    k0, nk = _key_tiles(qt, st, bq, bk, w, T)
    f0, f1 = _full_tiles(qt, st, bq, bk, w, 0, k0, nk) if T >= bk else (k0, k0)
    c = scale * LOG2E

    def body(kt, dq, masked=True):
        kpos = kt * bk + jnp.arange(bk)
        if masked:
            kok = kpos < T
            k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
            v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
            vis = _visible(t, kpos, st, w, T)
        else:           # a full tile (the forward's rule): no bounds mask, no visibility mask
            k, v = k_ref[b, pl.ds(kt * bk, bk), g, :], v_ref[b, pl.ds(kt * bk, bk), g, :]
            vis = None
        p = probs(dot(q, k, trans_b=True, precision=prec), vis, lse, c)
        ds = dscores(p, do, v, gs, delta, prec)
        return dq + dot(ds.astype(cdt), k, precision=prec)

    dq = lax.fori_loop(k0, f0, body, jnp.zeros((bq, Dk), jnp.float32))
    if T >= bk:
        dq = lax.fori_loop(f0, f1, functools.partial(body, masked=False), dq)
    dq = lax.fori_loop(f1, k0 + nk, body, dq)
    t_st = jnp.where(ok, t, T)
    dk_ = jnp.arange(Dk)
    store(dq_ref.at[b, t_st[:, None], hd, dk_[None, :]], dq * scale, ok[:, None])


# ---- backward: dK/dV ---------------------------------------------------------------------------
def _dkv_kernel(start_ref, last_ref, q_ref, k_ref, v_ref, do_ref, gs_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, *, h, bq, bk, w, scale, prec):
    g, b, kt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    T, Dk, Dv = q_ref.shape[1], q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    c = scale * LOG2E
    kpos = kt * bk + jnp.arange(bk)
    kok = kpos < T
    k = load(k_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
    v = load(v_ref.at[b, pl.ds(kt * bk, bk), g, :], kok[:, None])
    s_last = jnp.minimum(kt * bk + (bk - 1), T - 1)
    # queries that can see a key of this tile: from its first key to the end of the last key's
    # document, and within the window of the last key
    hi = jnp.minimum(last_ref[b, s_last] + 1, s_last + w)
    q0 = idiv(kt * bk, bq)
    nq = idiv(hi + (bq - 1), bq) - q0
    e0, e1 = _full_query_tiles(last_ref, b, kt, bk, bq, w, T, q0, nq)

    def step(it, carry, masked=True):
        # One loop over (query tile, head) pairs, not a head loop nested in a tile loop: Triton
        # pipelines only innermost loops, so the next pair's q / dO loads are in flight while
        # this pair's dots run, across tile boundaries too (the tiled selection dK/dV's
        # measurement: bench/NOTES.md, twenty-second session).
        i = idiv(it, h)
        qt = q0 + i
        t, ok = _rows(qt, bq, T)
        rows = pl.ds(qt * bq, bq)
        vis_t = None
        if masked:
            st = load(start_ref.at[b, rows], ok, other=T)
            vis_t = _visible(t, kpos, st, w, T, keys_first=True)
        dk, dv = carry
        hd = g * h + (it - i * h)
        q, do, gs, lse, delta = grad_rows(q_ref, do_ref, gs_ref, lse_ref, delta_ref,
                                          b, rows, hd, ok, cdt)
        # keys as rows (s^T = K Q^T): P^T and dS^T feed the dK / dV dots as they come
        s_t = dot(k, q, trans_b=True, precision=prec)   # raw; scaled in the exponent
        return dkv_accumulate_t(dk, dv, s_t, vis_t, q, do, v, gs, lse, delta, prec, cdt, c)

    carry = lax.fori_loop(0, e0 * h, step, (jnp.zeros((bk, Dk), jnp.float32),
                                            jnp.zeros((bk, Dv), jnp.float32)))
    carry = lax.fori_loop(e0 * h, e1 * h, functools.partial(step, masked=False), carry)
    dk, dv = lax.fori_loop(e1 * h, nq * h, step, carry)
    k_st = jnp.where(kok, kpos, T)  # masked rows -> out of bounds (dropped)
    dk_, dv_ = jnp.arange(Dk), jnp.arange(Dv)
    store(dk_ref.at[b, k_st[:, None], g, dk_[None, :]], dk * scale, kok[:, None])
    store(dv_ref.at[b, k_st[:, None], g, dv_[None, :]], dv, kok[:, None])


def local_backward(q, k, v, start, o, lse, do, gs, window: int | None, bs: BlockSizes,
                   scale: float, interpret: bool, *, choices: KernelChoices | None = None):
    """-> dq, dk, dv float32 for the output cotangent ``gs[..., None] * do`` (``do`` in any
    float dtype, cast to q's dtype for the dots; ``gs`` [B,T,Hq] per-row scale, None = 1)."""
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    gs = jnp.ones((B, T, Hq), jnp.float32) if gs is None else gs.astype(jnp.float32)
    delta = gs * jnp.sum(o * do.astype(jnp.float32), axis=-1)
    kw = dict(h=Hq // G, bq=bs.win_q, bk=bs.win_keys, w=_span(window, T), scale=scale,
              prec=dot_precision(q.dtype, interpret, choices))
    cp = compiler_params(bs.num_warps, bs.num_stages)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, **kw), grid=(Hq, B, cdiv(T, bs.win_q)),
        out_shape=jax.ShapeDtypeStruct((B, T, Hq, Dk), jnp.float32),
        compiler_params=cp, interpret=interpret, name="nsa_local_bwd_dq",
    )(start, q, k, v, do, gs, lse, delta)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, **kw), grid=(G, B, cdiv(T, bs.win_keys)),
        out_shape=[jax.ShapeDtypeStruct((B, T, G, Dk), jnp.float32),
                   jax.ShapeDtypeStruct((B, T, G, Dv), jnp.float32)],
        compiler_params=cp, interpret=interpret, name="nsa_local_bwd_dkv",
    )(start, doc_last(start), q, k, v, do, gs, lse, delta)
    return dq, dk, dv


# ---- the differentiable op ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Static:
    window: int | None
    bs: BlockSizes
    choices: KernelChoices
    interpret: bool
    scale: float


def local_attention(q, k, v, start=None, window: int | None = None,
                    block_sizes: BlockSizes | None = None, *, interpret: bool | None = None,
                    choices: KernelChoices | None = None):
    """Document-local (and optionally windowed) causal attention, differentiable.

    q [B,T,Hq,Dk], k [B,T,G,Dk], v [B,T,G,Dv] (Hq a multiple of G, any head dims: padded to a
    power of two >= 16 inside), start int32 [B,T]: first token of each token's document
    (``semantics.document_starts``; None = one document per row), window: w or None (causal
    only). Returns float32 [B,T,Hq,Dv]. ``interpret`` None: by ``jax.default_backend()``.
    """
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    if Hq % G:
        raise ValueError(f"query heads ({Hq}) must be a multiple of the KV heads ({G})")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 or None, got {window}")
    start = jnp.zeros((B, T), jnp.int32) if start is None else jnp.asarray(start, jnp.int32)
    if start.shape != (B, T):
        raise ValueError(f"start must have shape {(B, T)}, got {tuple(start.shape)}")
    bs = block_sizes or BlockSizes.for_shape(Hq // G, max(Dk, Dv), jnp.dtype(q.dtype).itemsize)
    st = _Static(window, bs, choices_or_default(choices),
                 use_interpret() if interpret is None else bool(interpret), 1.0 / math.sqrt(Dk))
    Dkp, Dvp = padded_dims(Dk, Dv)
    o = _local(pad_dim(q, Dkp), pad_dim(k, Dkp), pad_dim(v, Dvp), lax.stop_gradient(start), st)
    return o[..., :Dv]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _local(q, k, v, start, st: _Static):
    return _local_fwd(q, k, v, start, st)[0]


def _local_fwd(q, k, v, start, st: _Static):
    o, lse = local_forward(q, k, v, start, st.window, st.bs, st.scale, st.interpret,
                           choices=st.choices)
    return o, (q, k, v, start, o, lse)


def _local_bwd(st: _Static, res, do):
    q, k, v, start, o, lse = res
    dq, dk, dv = local_backward(q, k, v, start, o, lse, do, None, st.window, st.bs, st.scale,
                                st.interpret, choices=st.choices)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_local.defvjp(_local_fwd, _local_bwd)
