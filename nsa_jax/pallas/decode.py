"""NSA attention of one new token per batch row over the KV caches: Pallas kernels.

The kernel twin of :func:`nsa_jax.nsa.decoding.nsa_decode_attention` (same cache layout, same
rules from :mod:`nsa_jax.nsa.semantics`). A step's cost follows the keys NSA reads, not the
context: the visible compressed keys (T/d), the n selected blocks (n·l') and the window (w).

Every program handles all h query heads of one KV group (rows padded to >= 16 for the tensor
cores), so each K/V tile is read once per group. Decoding has only B x G (row, group) pairs, too
few programs to fill a GPU, so the attention kernels also split over keys (flash-decoding) and
write partial softmax states (m, l, acc) that the finishing kernel merges:

1. ``_cmp_kernel`` (grid B x G x splits): compressed attention (Eq. 8) over the *visible*
   compressed blocks only — the loop stops at the last visible tile, nothing past t is read. It
   also writes the scaled logits of the visible blocks and each split's lse (its ``logits`` flag;
   off for the dense model's decode attention, ``decode_dense``), from which
   :mod:`nsa_jax.pallas.decode_select` forms the group-summed block scores (Eq. 9-10) and the
   top-n with the forced blocks (Eq. 11): ids in score order, forced blocks first.
2. ``_slc_win_kernel`` (grid B x G x (n_sel + window tiles) / per): ``per`` selected blocks
   (loaded by index; keys past t masked) or tiles of the window ring buffer per program.
3. ``_finish_kernel`` (grid B x G x h) merges each branch's partial states and mixes them with
   the gates (Eq. 5), one program per head; given the gates as ``GateLogits`` it applies their
   sigmoid itself.

Logits are kept in base 2 (scaled by log2 e) inside the kernels, as in the training kernels.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.cache_write import Columns, flat_columns
from nsa_jax.pallas.decode_select import MERGE_TILE, default_chunk, select_ids
from nsa_jax.pallas.common import (LOG2E, MIN_DOT, NEG_INF, cdiv, compiler_params, dot,
                                   dot_precision, load, next_pow2, softmax_init, softmax_step,
                                   store, use_interpret)

CMP_KEYS = 64          # compressed keys per tile
WIN_KEYS = 64          # window slots per program
CMP_PROGRAMS = 2048    # compressed-attention programs to aim for (bandwidth-bound at large B)
CMP_STAGES = 2         # pipeline stages of the compressed kernel's key loop
SLC_UNITS = 1024       # selected + window programs above which each program takes two units


@dataclasses.dataclass(frozen=True)
class GateLogits:
    """The gates (Eq. 5) as pre-activations, for the finishing kernel to apply the sigmoid:
    ``logits`` [B, 3Hq] (head-major, (cmp, slc, win) per head) or ``cache_write.Columns`` of a
    wider array read as [3Hq] (the decode step's fused projection), plus ``bias`` [3Hq] added in
    the logits' dtype; g = sigmoid in float32 rounded to ``dtype``: the model's gate values,
    without an XLA kernel per layer to form them (bench/NOTES.md, thirteenth session)."""
    logits: Columns | jax.Array
    bias: jax.Array
    dtype: Any


jax.tree_util.register_dataclass(GateLogits, data_fields=["logits", "bias"], meta_fields=["dtype"])


def _rows(h: int) -> int:
    return max(MIN_DOT, next_pow2(h))


def _online(carry, s, v, prec):
    """One online-softmax update (base 2, ``common.softmax_step``): s [hp, K] logits, already
    scaled (the compressed kernel stores them for the scores), v [K, Dv]."""
    m, l, acc = carry
    m, alpha, p, l = softmax_step(m, l, s, 1.0)
    return m, l, acc * alpha[:, None] + dot(p.astype(v.dtype), v, precision=prec)


def _store_state(m_ref, l_ref, o_ref, b, g, sp, state, h):
    m, l, acc = state
    hp = m.shape[0]
    r = jnp.arange(hp)
    ok = r < h
    rs = jnp.where(ok, r, h)                      # masked rows -> out of bounds (dropped)
    dv = jnp.arange(acc.shape[1])
    store(m_ref.at[b, g, sp, rs], m, ok)
    store(l_ref.at[b, g, sp, rs], l, ok)
    store(o_ref.at[b, g, sp, rs[:, None], dv[None, :]], acc, ok[:, None])


def _load_q(q_ref, b, g, h):
    hp = _rows(h)
    r = jnp.arange(hp)
    ok = r < h
    dk = jnp.arange(q_ref.shape[-1])
    return load(q_ref.at[b, g, jnp.where(ok, r, 0)[:, None], dk[None, :]], ok[:, None])


# ---- 1. compressed attention + logits of the visible blocks ---------------------------------
def _cmp_kernel(t_ref, q_ref, k_ref, v_ref, *outs, h, l_cmp, d_cmp, splits, bk, scale, prec,
                logits=True):
    """One split of the visible keys of (row b, group g): keys i with i*d + l - 1 <= t (Eq. 8;
    l = d = 1: every key up to t, plain causal attention: ``decode_dense``). ``logits``: also
    store the scaled logits and the split's lse for the block scores (outs = s, m, l, o, lse),
    else outs = m, l, o."""
    s_ref, m_ref, l_ref, o_ref, lse_ref = outs if logits else (None, *outs, None)
    b, g, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    Tc = k_ref.shape[2]
    t = t_ref[b]
    nvis = jnp.where(t + 1 >= l_cmp, (t + 1 - l_cmp) // d_cmp + 1, 0)   # Eq. 8: complete blocks
    nvis = jnp.minimum(nvis, Tc)
    n_tiles = (nvis + bk - 1) // bk
    per = (n_tiles + splits - 1) // splits
    lo = jnp.minimum(sp * per, n_tiles)
    hi = jnp.minimum(lo + per, n_tiles)
    q = _load_q(q_ref, b, g, h)
    hp = q.shape[0]
    r = jnp.arange(hp)
    rs = jnp.where(r < h, r, h)
    c = scale * LOG2E

    def tile(i, carry):
        idx = i * bk + jnp.arange(bk)
        ok = idx < nvis
        k = load(k_ref.at[b, g, pl.ds(i * bk, bk), :], ok[:, None])
        v = load(v_ref.at[b, g, pl.ds(i * bk, bk), :], ok[:, None])
        s = jnp.where(ok[None, :], dot(q, k, trans_b=True, precision=prec) * c, NEG_INF)
        if logits:
            store(s_ref.at[b, g, rs[:, None], jnp.where(ok, idx, Tc)[None, :]], s,
                  (r < h)[:, None] & ok[None, :])
        return _online(carry, s, v, prec)

    state = lax.fori_loop(lo, hi, tile, softmax_init(hp, v_ref.shape[-1]))
    _store_state(m_ref, l_ref, o_ref, b, g, sp, state, h)
    if not logits:
        return
    m, l, _ = state          # the split's own lse (-inf: no key), for decode_select._merged_lse
    own = jnp.where(l > 0, m + jnp.log2(jnp.where(l > 0, l, 1.0)), NEG_INF)
    store(lse_ref.at[b, g, sp, rs], own, r < h)


def _cmp_call(t, q, k_cmp, v_cmp, cfg, splits, bk, scale, interpret, stages=2, warps=None, *,
              block=None, logits=True, name="nsa_decode_cmp"):
    """-> (s, m, l, o, lse), or with ``logits=False`` (m, l, o): the partial states of the
    ``splits`` key ranges. ``block=(l, d)`` overrides the visibility rule's (cfg.block_l,
    cfg.stride_d); (1, 1) is causal attention over the keys themselves."""
    B, G, h, _ = q.shape
    Tc, Dv = k_cmp.shape[2], v_cmp.shape[-1]
    hp = _rows(h)
    l_cmp, d_cmp = block or (cfg.block_l, cfg.stride_d)
    kern = functools.partial(_cmp_kernel, h=h, l_cmp=l_cmp, d_cmp=d_cmp,
                             splits=splits, bk=bk, scale=scale,
                             prec=dot_precision(q.dtype, interpret), logits=logits)
    f32 = jnp.float32
    state = [jax.ShapeDtypeStruct((B, G, splits, h), f32),
             jax.ShapeDtypeStruct((B, G, splits, h), f32),
             jax.ShapeDtypeStruct((B, G, splits, h, Dv), f32)]
    out_shape = ([jax.ShapeDtypeStruct((B, G, h, Tc), f32), *state,
                  jax.ShapeDtypeStruct((B, G, splits, h), f32)] if logits else state)
    return pl.pallas_call(
        kern, grid=(B, G, splits), out_shape=out_shape,
        compiler_params=compiler_params(warps or (4 if hp * Dv > 4096 else 2), stages),
        interpret=interpret, name=name,
    )(t, q, k_cmp, v_cmp)


def _merge_head(m_ref, l_ref, b, g, hh, lo, hi, pp):
    """Partial softmax states lo..hi-1 (axis 2) of (b, g) for head hh: -> (indices [pp], valid
    [pp], merge weights w = 2^(m - M) [pp], L = sum l w, M); M is 0 when no key is visible.
    Used by the finishing kernel (the merged output)."""
    p = lo + jnp.arange(pp)
    ok = p < hi
    pi = jnp.where(ok, p, lo)
    m = load(m_ref.at[b, g, pi, hh], ok, NEG_INF)
    l = load(l_ref.at[b, g, pi, hh], ok, 0.0)
    M = jnp.max(m)
    M = jnp.where(M == NEG_INF, 0.0, M)
    w = jnp.exp2(m - M)
    return pi, ok, w, jnp.sum(l * w), M


# ---- 2. selected blocks and window tiles ----------------------------------------------------
def _slc_win_kernel(t_ref, ids_ref, q_ref, ks_ref, vs_ref, kw_ref, vw_ref, m_ref, l_ref, o_ref,
                    *, h, n_slc, n_sp, has_win, l_sel, window, bw, per, scale, prec):
    """Program u < n_sp: selected blocks u*per .. u*per+per-1 (loaded by index; keys past t
    masked); program u >= n_sp: window tiles (u-n_sp)*per .. of the ring buffer. Each writes one
    partial softmax state; a program never mixes the two branches (they have their own gates)."""
    b, g, u = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    t = t_ref[b]
    q = _load_q(q_ref, b, g, h)
    c = scale * LOG2E
    hp = q.shape[0]
    Dv = o_ref.shape[-1]

    def attend(carry, k_ref, v_ref, start, ok, nk):
        k = load(k_ref.at[b, g, pl.ds(start, nk), :], ok[:, None])
        v = load(v_ref.at[b, g, pl.ds(start, nk), :], ok[:, None])
        s = jnp.where(ok[None, :], dot(q, k, trans_b=True, precision=prec) * c, NEG_INF)
        return _online(carry, s, v, prec)

    if n_slc:
        @pl.when(u < n_sp)
        def _():
            nk = max(MIN_DOT, next_pow2(l_sel))
            off = jnp.arange(nk)
            st = softmax_init(hp, Dv)
            for i in range(per):
                e = u * per + i
                j = ids_ref[b, g, jnp.minimum(e, n_slc - 1)]
                base = jnp.maximum(j, 0) * l_sel
                ok = (e < n_slc) & (j >= 0) & (off < l_sel) & (base + off <= t)
                st = attend(st, ks_ref, vs_ref, base, ok, nk)
            _store_state(m_ref, l_ref, o_ref, b, g, u, st, h)

    if has_win:
        @pl.when(u >= n_sp)
        def _():
            W = kw_ref.shape[2]
            st = softmax_init(hp, Dv)
            for i in range(per):
                start = ((u - n_sp) * per + i) * bw
                slot = start + jnp.arange(bw)
                pos = t - lax.rem(t - slot + W, W)     # position held by each ring slot
                ok = (slot < W) & (pos >= 0) & (pos > t - window)
                st = attend(st, kw_ref, vw_ref, start, ok, bw)
            _store_state(m_ref, l_ref, o_ref, b, g, u, st, h)


def _slc_win_call(t, ids, q, kv, cfg, bw, per, scale, interpret):
    """Partial states [B,G,U,h] (m, l) and [B,G,U,h,Dv] (acc) of the selected blocks (the first
    cdiv(n_sel, per) slots) and the window tiles (the rest), ``per`` blocks or tiles per program."""
    B, G, h, _ = q.shape
    has_slc, has_win = "k_slc" in kv and ids is not None, "k_win" in kv
    n_slc = ids.shape[-1] if has_slc else 0
    n_sp = cdiv(n_slc, per)
    n_wp = cdiv(cdiv(kv["k_win"].shape[2], bw), per) if has_win else 0
    Dv = (kv["v_slc"] if has_slc else kv["v_win"]).shape[-1]
    units = n_sp + n_wp
    kern = functools.partial(_slc_win_kernel, h=h, n_slc=n_slc, n_sp=n_sp, has_win=has_win,
                             l_sel=cfg.sel_block, window=cfg.window, bw=bw, per=per, scale=scale,
                             prec=dot_precision(q.dtype, interpret))
    dummy = jnp.zeros((B, G, 1, q.shape[-1]), q.dtype)     # stands in for an ablated branch
    args = [t, ids if has_slc else jnp.zeros((B, G, 1), jnp.int32), q]
    args += [kv["k_slc"], kv["v_slc"]] if has_slc else [dummy, dummy]
    args += [kv["k_win"], kv["v_win"]] if has_win else [dummy, dummy]
    f32 = jnp.float32
    return pl.pallas_call(
        kern, grid=(B, G, units),
        out_shape=[jax.ShapeDtypeStruct((B, G, units, h), f32),
                   jax.ShapeDtypeStruct((B, G, units, h), f32),
                   jax.ShapeDtypeStruct((B, G, units, h, Dv), f32)],
        compiler_params=compiler_params(4 if _rows(h) * Dv > 4096 else 2, 2),
        interpret=interpret, name="nsa_decode_slc_win",
    )(*args), n_sp


# ---- 3. epilogue ----------------------------------------------------------------------------
def _finish_kernel(g_ref, gb_ref, mc_ref, lc_ref, oc_ref, ms_ref, ls_ref, os_ref, out_ref, *,
                   n_sp, has_cmp, has_slc, has_win, pc, ps_, h, gate_at):
    """Merge every branch's partial states and mix them with the gates (Eq. 5) for one head of
    one (row, group): out = sum_c g_c o_c, o_c = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p.
    One program per head: the branches' merges are independent chains, no loop over heads.

    ``gate_at`` None: g_ref [B,G,h,3] holds the gates. Else ``(offset, dtype)``: g_ref is a
    [B, W] array with the gate logits of head j, branch c at column offset + 3j + c, gb_ref their
    bias [3Hq], and g_c = sigmoid(logit + bias) (Eq. 5) in float32, rounded to ``dtype`` as the
    model's gate values are."""
    b, g, hh = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    def gate(col):
        if gate_at is None:
            return g_ref[b, g, hh, col].astype(jnp.float32)
        off, dt = gate_at
        j = (g * h + hh) * 3 + col
        z = (g_ref[b, off + j] + gb_ref[j]).astype(jnp.float32)   # the add in the logits' dtype
        return (1.0 / (1.0 + jnp.exp(-z))).astype(dt).astype(jnp.float32)

    U = ms_ref.shape[2]
    dv = jnp.arange(out_ref.shape[-1])
    parts = []                       # (partials, gate column, lo, hi, padded count) per branch
    if has_cmp:
        parts.append(((mc_ref, lc_ref, oc_ref), 0, 0, mc_ref.shape[2], pc))
    if has_slc:
        parts.append(((ms_ref, ls_ref, os_ref), 1, 0, n_sp, ps_))
    if has_win:
        parts.append(((ms_ref, ls_ref, os_ref), 2, n_sp, U, ps_))
    out = jnp.zeros(dv.shape, jnp.float32)
    for (m_ref, l_ref, o_ref), col, lo, hi, pp in parts:
        pi, ok, w, L, _ = _merge_head(m_ref, l_ref, b, g, hh, lo, hi, pp)
        coef = jnp.where(L > 0, gate(col) / jnp.where(L > 0, L, 1.0), 0.0)
        o = load(o_ref.at[b, g, pi[:, None], hh, dv[None, :]], ok[:, None], 0.0)
        out += coef * jnp.sum(o * w[:, None], axis=0)
    store(out_ref.at[b, g, hh, dv], out, dv >= 0)


def _finish_call(gates, cmp_parts, sw_parts, n_sp, br, dtype, interpret, B, G, h):
    """``gates`` [B,Hq,3] values or :class:`GateLogits` (the sigmoid in the kernel)."""
    if isinstance(gates, GateLogits):
        g2, off, (w,) = flat_columns(gates.logits, 1)
        if w != 3 * G * h or gates.bias.shape != (w,) or g2.shape[0] != B:
            raise ValueError(f"GateLogits: [B={B}, 3Hq={3 * G * h}] logits and a [3Hq] bias, got "
                             f"{g2.shape[0]} rows of {w} and bias {gates.bias.shape}")
        gargs, gate_at = (g2, gates.bias.astype(g2.dtype)), (off, gates.dtype)
    else:
        gargs, gate_at = (gates.reshape(B, G, h, 3), jnp.zeros((1,), jnp.float32)), None
    dummy = [jnp.zeros((B, G, 1, h), jnp.float32), jnp.zeros((B, G, 1, h), jnp.float32)]
    mc, lc, oc = cmp_parts if cmp_parts is not None else dummy + [jnp.zeros((B, G, 1, h, 16))]
    ms, ls, os_ = sw_parts if sw_parts is not None else dummy + [jnp.zeros((B, G, 1, h, 16))]
    Dv = (oc if cmp_parts is not None else os_).shape[-1]
    kern = functools.partial(_finish_kernel, n_sp=n_sp, has_cmp="cmp" in br,
                             has_slc="slc" in br, has_win="win" in br,
                             pc=next_pow2(mc.shape[2]), ps_=next_pow2(ms.shape[2]), h=h,
                             gate_at=gate_at)
    return pl.pallas_call(
        kern, grid=(B, G, h),
        out_shape=jax.ShapeDtypeStruct((B, G, h, Dv), dtype),
        compiler_params=compiler_params(2, 1), interpret=interpret, name="nsa_decode_finish",
    )(*gargs, mc, lc, oc, ms, ls, os_)   # gates in their dtype: no convert kernel per layer


MAX_SPLITS = 32        # splits per (row, group) above ONE_TILE_UNITS
ONE_TILE_UNITS = 1280  # (row, group, tile) units up to which every compressed tile has a program
MAX_TILE_SPLITS = 128  # ... at most this many per (row, group)


def _splits(B: int, G: int, Tc: int, bk: int) -> int:
    """Key splits of the compressed kernel, from the cache's allocated length Tc (the decoder's
    caches are padded: ``nsa_jax.decode.cache_sizes``). Up to ONE_TILE_UNITS (row, group, tile)
    units in all, one tile per program (at most MAX_TILE_SPLITS per row and group): at small
    B x context the programs are few and short, so each should wait on one tile's loads only
    (H100, 125M shape, per layer: 128k / B=1, 128 splits 3.1 us against 5.2 with 32; 64k / B=8
    (1024 units), 64 splits 5.8 against 6.1; bench/NOTES.md, twenty-sixth session). The
    threshold sits above the measured 1024 so that a padded cache of such a context (up to
    ALIGN / 64 = 4 more tiles per row: 1088 units at 64k / B=8) stays on this side, and below
    the 2048 units of 128k / B=8 (2112 padded), where 32 splits (4 tiles each) took 13.1 us
    against 13.6 with 64 and 14.7 with 128. Above it, about CMP_PROGRAMS (row, group, split)
    programs, at most MAX_SPLITS: at large B x context the kernel streams the compressed cache
    (268 MB per layer at 128k / B=64): 16 splits there took 71 us per layer against 85 us with
    3 (H200, nineteenth session)."""
    tiles = cdiv(Tc, bk)
    if B * G * tiles <= ONE_TILE_UNITS:
        return int(max(1, min(tiles, MAX_TILE_SPLITS)))
    return int(max(1, min(tiles, cdiv(CMP_PROGRAMS, B * G), MAX_SPLITS)))


def _slc_per(B: int, G: int, n_sel: int, n_win: int) -> int:
    """Units (selected blocks or window tiles) per program of the selected + window kernel: two
    where one each would give over SLC_UNITS programs (fewer partial states to write and merge),
    else one (H200, 125M shape: 2 took the kernel + finish from 24.3 to 22.4 us per layer at
    128k/B=64 and from 6.5 to 7.4 us at 64k/B=8; bench/NOTES.md, twelfth session)."""
    return 2 if B * G * (n_sel + n_win) > SLC_UNITS else 1


def _pad_last(x, D):
    return x if x.shape[-1] == D else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, D - x.shape[-1])])


def nsa_decode_pallas(q, kv: dict, t, gates, cfg: NSAConfig, *, cmp_keys: int = CMP_KEYS,
                      win_keys: int = WIN_KEYS, splits: int | None = None,
                      sel_chunk: int | None = None, merge_tile: int = MERGE_TILE,
                      cmp_stages: int = CMP_STAGES, cmp_warps: int | None = None,
                      slc_per: int | None = None, score_warps: int | None = None,
                      return_ids: bool = False):
    """q [B,Hq,Dk] at positions t [B] over the caches ``kv`` (layout in
    :mod:`nsa_jax.nsa.decoding`, tokens 0..t[b] written); gates [B,Hq,3] (or
    :class:`GateLogits`) -> [B,Hq,Dv] in q.dtype.

    ``cmp_keys`` compressed keys per tile, ``win_keys`` window slots per program (powers of two
    >= 16); ``splits`` programs per (row, group) over the compressed keys (default:
    ``_splits``); ``sel_chunk`` selection blocks per scoring program (default:
    ``decode_select.default_chunk``) and ``merge_tile`` candidates per top-n merge program
    (powers of two); ``cmp_stages`` software-pipeline stages of the compressed kernel's key
    loop (Triton ``num_stages``) and ``cmp_warps`` its warps per program (default: 4 when h
    padded to >= 16 rows times Dv is over 4096, else 2); ``slc_per`` selected blocks (or window
    tiles) per program of the selected + window kernel (default: ``_slc_per``).
    ``return_ids``: also the selected block ids [B,G,n_sel] (score order, -1 in unused slots;
    None without the selection branch). Head dims that are not a power of two >= 16 are
    zero-padded (a copy of the caches: fine for tests, slow for real models, which use 64 or
    128)."""
    B, Hq, Dk = q.shape
    if cmp_warps is not None and cmp_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"nsa_decode_pallas: cmp_warps must be one of 1, 2, 4, 8, 16 (or None), "
                         f"got {cmp_warps!r}")
    if score_warps is not None and score_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"nsa_decode_pallas: score_warps must be one of 1, 2, 4, 8, 16 (or "
                         f"None), got {score_warps!r}")
    t = jnp.broadcast_to(jnp.asarray(t, jnp.int32), (B,))
    return _decode_once(q, kv, t, gates, cfg, cmp_keys, win_keys, splits, sel_chunk, merge_tile,
                        cmp_stages, cmp_warps, slc_per, score_warps, return_ids, use_interpret())


def _decode(q, kv: dict, t, gates, cfg: NSAConfig, cmp_keys: int, win_keys: int, splits,
            sel_chunk, merge_tile: int, cmp_stages: int, cmp_warps, slc_per, score_warps,
            return_ids: bool, interpret: bool):
    """:func:`nsa_decode_pallas`'s body (arguments checked, t [B] int32)."""
    B, Hq, Dk = q.shape
    br = cfg.branches
    G = next(kv[k] for k in ("k_cmp", "k_slc", "k_win") if k in kv).shape[1]
    h = Hq // G
    Dv = next(kv[k] for k in ("v_cmp", "v_slc", "v_win") if k in kv).shape[-1]
    Dkp, Dvp = max(MIN_DOT, next_pow2(Dk)), max(MIN_DOT, next_pow2(Dv))
    if (Dkp, Dvp) != (Dk, Dv):
        kv = {k: _pad_last(x, Dkp if k.startswith("k") else Dvp) for k, x in kv.items()}
    scale = 1.0 / math.sqrt(Dk)
    cdt = next(kv[k] for k in ("k_cmp", "k_slc", "k_win") if k in kv).dtype   # not "sync"
    qg = _pad_last(q.reshape(B, G, h, Dk).astype(cdt), Dkp)
    ids = cmp_parts = sw_parts = None
    if "cmp" in br or "slc" in br:
        Tc = kv["k_cmp"].shape[2]
        ns = splits or _splits(B, G, Tc, cmp_keys)
        s, m, l, o, lse = _cmp_call(t, qg, kv["k_cmp"], kv["v_cmp"], cfg, ns, cmp_keys, scale,
                                    interpret, cmp_stages, cmp_warps)
        cmp_parts = (m, l, o)
        if "slc" in br:
            Ts = kv["k_slc"].shape[2] // cfg.sel_block
            ids = select_ids(t, s, lse, cfg, Ts, sel_chunk or default_chunk(B, G, Ts),
                             merge_tile, interpret, score_warps)
    n_sp = 0
    if "slc" in br or "win" in br:
        per = slc_per or _slc_per(B, G, cfg.n_sel if "slc" in br else 0,
                                  cdiv(kv["k_win"].shape[2], win_keys) if "win" in br else 0)
        sw_parts, n_sp = _slc_win_call(t, ids, qg, kv, cfg, win_keys, per, scale, interpret)
    o = _finish_call(gates, cmp_parts if "cmp" in br else None, sw_parts, n_sp, br, q.dtype,
                     interpret, B, G, h)
    o = o[..., :Dv].reshape(B, Hq, Dv)
    return (o, ids) if return_ids else o


# a jitted function of its own, as the training op (``pallas.nsa._nsa_once``): a decode call's
# layers trace it, and lower its kernels, once
_decode_once = jax.jit(_decode, static_argnums=tuple(range(4, 16)))
