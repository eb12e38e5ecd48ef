"""Tiled (block-sparse flash) selection kernels (``pallas/selection_tiled.py``) against the
pure-JAX reference: interpret mode on the CPU, float32, relative error <= 2e-5 for o, the lse and
dq/dk/dv, and for the output and all 8 input gradients of a full NSA call with
``sel_impl="tiled"``. GPU tests (bf16 vs the float32 reference) run on the device machine."""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig, nsa_attention, semantics
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes, selection_kernels
from nsa_jax.pallas.common import LN2, use_interpret
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.selection_tiled import sel_tiled_backward, sel_tiled_forward
from nsa_jax.pallas.tiled_index import (diagonal_tiles, full_blocks, member_table, tile_index,
                                        words_by_block, words_by_tile)
from nsa_testutil import assert_launch_follows_num_warps, kernel_warps, random_inputs, rrmse

TOL = 2e-5
TINY = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1, n_local=1)
NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite values in the kernel result"
    nb = np.linalg.norm(b)
    assert nb > 0, "reference is all zeros: the comparison would be vacuous"
    return float(np.linalg.norm(a - b) / nb)


def _top_n_like(rng, rel, G, cfg, future, later):
    """int32 [B,T,G,n] selections shaped like top-n's for queries at (document-relative)
    positions ``rel`` [B,T]: the forced initial/local blocks, a random number of other visible
    blocks, -1 in unused slots, random slot order, and with probability ``future`` one id drawn
    from ``later(cur)`` = [lo, hi) (None: none) after the query's block ``cur``."""
    B, T = rel.shape
    n, l = cfg.n_sel, cfg.sel_block
    idx = np.full((B, T, G, n), -1, np.int32)
    for b in range(B):
        for t in range(T):
            cur = int(rel[b, t]) // l
            for g in range(G):
                forced = sorted({j for j in range(cfg.n_init)} | {cur - i for i in
                                                                  range(cfg.n_local)})
                forced = [j for j in forced if 0 <= j <= cur]
                cand = [j for j in range(cur + 1) if j not in forced]
                k = int(rng.integers(0, n - len(forced) + 1))
                ids = forced + list(rng.choice(cand, size=min(k, len(cand)), replace=False))
                span = later(cur)
                if len(ids) < n and span is not None and rng.random() < future:
                    ids.append(int(rng.integers(*span)))
                rng.shuffle(ids)
                idx[b, t, g, :len(ids)] = ids
    return idx


def _selection(rng, B, T, G, cfg, future=0.1):
    """Random selections shaped like top-n's: forced initial/local blocks, a random number of
    other visible blocks, -1 in unused slots, now and then a block after the query (ignored),
    ids in random slot order. Then hand-made rows: in query tile 1 (16 rows) of (b=0, g=0) even
    rows select only block 0 and odd rows only block 1 (disjoint selections within a tile);
    rows 3 and 4 of (b=B-1, g=G-1) see no key (only a future block / all slots unused)."""
    Ts = cfg.num_sel_blocks(T)
    idx = _top_n_like(rng, np.broadcast_to(np.arange(T), (B, T)), G, cfg, future,
                      lambda cur: (cur + 1, Ts) if cur + 1 < Ts else None)
    assert T >= 32 and Ts >= 3
    idx[0, 16:32, 0, :] = -1
    idx[0, 16:32:2, 0, 0] = 0
    idx[0, 17:32:2, 0, 0] = 1
    idx[B - 1, 3:5, G - 1, :] = -1
    idx[B - 1, 3, G - 1, 1] = Ts - 1
    return jnp.asarray(idx)


@functools.partial(jax.jit, static_argnums=6)
def _reference(q, k, v, idx, do, gs, cfg, seg=None):
    """Reference o, (dq, dk, dv) for the cotangent gs * do, and the base-2 log-sum-exp of the
    scaled logits over the selected visible keys (+inf where there is none); ``seg``: packed
    rows' segment ids (idx document-relative)."""
    o, vjp = jax.vjp(lambda q, k, v: ref.selection_attention(q, k, v, idx, cfg, seg), q, k, v)
    B, T, Hq, D = q.shape
    G = k.shape[2]
    mask = ref.selected_token_mask(idx, T, cfg, seg)[:, :, :, None, :]  # [B,T,G,1,S]
    s = jnp.einsum("btghd,bsgd->btghs", q.reshape(B, T, G, Hq // G, D), k) / math.sqrt(D)
    lse = jax.nn.logsumexp(jnp.where(mask, s, -jnp.inf), axis=-1) / LN2
    lse = jnp.where(jnp.any(mask, axis=-1), lse, jnp.inf).reshape(B, T, Hq)
    return o, vjp(do * gs[..., None]), lse


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _sel_inputs(B, T, Hq, G, D, key):
    ks = jax.random.split(key, 5)
    return (jax.random.normal(ks[0], (B, T, Hq, D)), jax.random.normal(ks[1], (B, T, G, D)),
            jax.random.normal(ks[2], (B, T, G, D)), jax.random.normal(ks[3], (B, T, Hq, D)),
            jax.random.uniform(ks[4], (B, T, Hq), minval=0.2, maxval=1.0))


@pytest.mark.parametrize("h,G,cfg,D,bs", [
    # h=1; T=75 is not a multiple of l'=16 nor of the 16-row tiles
    (1, 2, TINY, 16, BlockSizes(sel_tile_q=16, sel_keys=16)),
    # h=2; blocks of 32 keys walked in 2 sub-tiles of 16; n=5 slots (padded to 8 in the kernel)
    (2, 2, dataclasses.replace(TINY, sel_block=32, n_sel=5, n_local=2), 32,
     BlockSizes(sel_tile_q=32, sel_keys=16)),
    # h=6; a 32-row tile spans two blocks of 16
    (6, 1, TINY, 16, BlockSizes(sel_tile_q=32)),
    # l'=24: one 32-key sub-tile with 8 keys masked
    (2, 1, dataclasses.replace(TINY, sel_block=24, n_sel=3), 16, BlockSizes(sel_tile_q=16)),
])
def test_tiled_selection_matches_reference(h, G, cfg, D, bs):
    B = 2
    T = {16: 75, 32: 150, 24: 100}[cfg.sel_block]
    rng = np.random.default_rng(h * 10 + G)
    q, k, v, do, gs = _sel_inputs(B, T, h * G, G, D, jax.random.PRNGKey(h + G))
    idx = _selection(rng, B, T, G, cfg)
    scale = 1.0 / math.sqrt(D)

    @jax.jit
    def run(q, k, v, idx, do, gs):
        o, lse = sel_tiled_forward(q, k, v, idx, cfg, bs, scale, True)
        return (o, lse), sel_tiled_backward(q, k, v, idx, o, lse, do, gs, cfg, bs, scale, True)
    (o, lse), grads = run(q, k, v, idx, do, gs)

    o_r, g_r, lse_r = _reference(q, k, v, idx, do, gs, cfg)
    assert o.dtype == jnp.float32 and lse.shape == (B, T, h * G)
    errs = {"o": _rel(o, o_r)}
    errs.update({n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), grads, g_r)})
    fin = np.isfinite(np.asarray(lse_r))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), fin)
    errs["lse"] = _rel(np.asarray(lse)[fin], np.asarray(lse_r)[fin])
    bad = {k_: f"{e:.2e}" for k_, e in errs.items() if not e <= TOL}
    assert not bad, f"relative error above {TOL}: {bad}"
    # rows 3, 4 of (b=B-1, g=G-1) see no key: o = 0, lse = +inf, no gradient into q
    heads = slice((G - 1) * h, G * h)
    assert not np.isfinite(np.asarray(lse)[B - 1, 3:5, heads]).any()
    assert np.abs(np.asarray(o)[B - 1, 3:5, heads]).max() == 0.0
    assert np.abs(np.asarray(grads[0])[B - 1, 3:5, heads]).max() == 0.0


def test_tiled_backward_gate_folded_equals_gated_cotangent():
    """The tiled dK/dV kernels take the gate folded into lse (``common.fold_gate``), the dQ kernel
    as a row operand: dq, dk, dv equal the same kernels' with the gate moved into the cotangent
    (gs * dO, no gate) to 2e-5, with gates of exactly 0 (P' = 0) and 1 on some rows."""
    cfg, bs, B, T, h, G, D = TINY, BlockSizes(sel_tile_q=16, sel_keys=16), 2, 75, 2, 2, 16
    q, k, v, do, gs = _sel_inputs(B, T, h * G, G, D, jax.random.PRNGKey(7))
    rows = np.arange(T)
    gs = jnp.where((rows % 7 == 1)[None, :, None], 1.0, gs)
    gs = jnp.where((rows % 5 == 0)[None, :, None], 0.0, gs)
    idx = _selection(np.random.default_rng(7), B, T, G, cfg)
    scale = 1.0 / math.sqrt(D)

    @jax.jit
    def run(q, k, v, idx, do, gs):
        o, lse = sel_tiled_forward(q, k, v, idx, cfg, bs, scale, True)
        return (sel_tiled_backward(q, k, v, idx, o, lse, do, gs, cfg, bs, scale, True),
                sel_tiled_backward(q, k, v, idx, o, lse, gs[..., None] * do, None, cfg, bs,
                                   scale, True))
    got, want = run(q, k, v, idx, do, gs)
    assert float(jnp.abs(got[0]).max()) > 0
    for a, b in zip(got, want):
        assert bool(jnp.all(jnp.isfinite(a)))
        assert _rel(a, b) <= 2e-5
    assert float(jnp.abs(got[0][:, rows % 5 == 0]).max()) == 0.0   # a zero gate: no dQ


def test_tile_index_lists_each_tile_union_and_its_inverse():
    cfg = TINY
    B, T, G, bq = 2, 75, 2, 16
    Ts, nqt = cfg.num_sel_blocks(T), -(-T // bq)
    idx = np.array(_selection(np.random.default_rng(3), B, T, G, cfg))
    idx[1, 40, 1, 0] = Ts + 2  # out of range: ignored like -1
    blocks, bcount, tiles, tcount = [np.asarray(x) for x in jax.jit(
        lambda i: tile_index(i, T, cfg, bq))(jnp.asarray(idx))]
    assert blocks.shape == (B, G, nqt, Ts) and tiles.shape == (B, G, Ts, nqt)
    for b in range(B):
        for g in range(G):
            for i in range(nqt):
                rows = idx[b, i * bq:(i + 1) * bq, g].ravel()
                last = min((i + 1) * bq, T) - 1
                want = sorted({int(j) for j in rows if 0 <= j < Ts and j * cfg.sel_block <= last})
                assert list(blocks[b, g, i, :bcount[b, g, i]]) == want
            for j in range(Ts):
                want = [i for i in range(nqt) if j in blocks[b, g, i, :bcount[b, g, i]]]
                assert list(tiles[b, g, j, :tcount[b, g, j]]) == want
    # the hand-made tile 1 of (0, 0): even rows block 0, odd rows block 1
    assert list(blocks[0, 0, 1, :bcount[0, 0, 1]]) == [0, 1]

    # the causal split: each tile's full blocks (ending at or before its first query) are the
    # first nfull of its list, each block's masked tiles (starting before its last key) the first
    # ndiag of its list; both kinds occur here
    l = cfg.sel_block
    nfull = np.asarray(full_blocks(*map(jnp.asarray, (blocks, bcount)), bq, l))
    ndiag = np.asarray(diagonal_tiles(*map(jnp.asarray, (tiles, tcount)), bq, l))
    assert nfull.shape == bcount.shape and ndiag.shape == tcount.shape
    assert 0 < nfull.sum() < bcount.sum() and 0 < ndiag.sum() < tcount.sum()
    for b in range(B):
        for g in range(G):
            for i in range(nqt):
                full = [(j + 1) * l - 1 <= i * bq for j in blocks[b, g, i, :bcount[b, g, i]]]
                assert full == [True] * nfull[b, g, i] + [False] * (len(full) - nfull[b, g, i])
            for j in range(Ts):
                diag = [i * bq < (j + 1) * l - 1 for i in tiles[b, g, j, :tcount[b, g, j]]]
                assert diag == [True] * ndiag[b, g, j] + [False] * (len(diag) - ndiag[b, g, j])


@pytest.mark.parametrize("bq", [16, 64])
def test_member_words_mark_the_rows_of_each_listed_pair(bq):
    """Bit r of a pair's words (in both lists' order) is set iff row r of the tile has the block
    among its ids; out-of-range ids, -1 and an id listed twice by one row count as the
    reference's any(idx == j) does. bq = 64 spans two 32-bit words."""
    cfg = TINY
    B, T, G = 2, 150, 2
    Ts = cfg.num_sel_blocks(T)
    idx = np.array(_selection(np.random.default_rng(5), B, T, G, cfg))
    idx[1, 40, 1, 0] = Ts + 2           # out of range
    idx[0, 70, 0, 1] = idx[0, 70, 0, 0]  # a row naming one block twice
    idx[0, 100, 1, :2] = [0, 0]
    blocks, bcount, tiles, tcount, by_tile, by_block = [np.asarray(x) for x in jax.jit(
        lambda i: (lambda bl, bc, ti, tc: (bl, bc, ti, tc) + (
            words_by_tile(member_table(i, T, cfg, bq), bl),
            words_by_block(member_table(i, T, cfg, bq), ti)))(*tile_index(i, T, cfg, bq)))(
        jnp.asarray(idx))]
    assert by_tile.shape[-1] == -(-bq // 32) and by_block.shape[-1] == by_tile.shape[-1]

    def bits(w):
        return [(int(w[r // 32]) >> (r % 32)) & 1 == 1 for r in range(bq)]

    def rows(i, g, b, j):
        return [i * bq + r < T and j in idx[b, i * bq + r, g] for r in range(bq)]

    seen = 0
    for b in range(B):
        for g in range(G):
            for i in range(blocks.shape[2]):
                for u in range(bcount[b, g, i]):
                    assert bits(by_tile[b, g, i, u]) == rows(i, g, b, blocks[b, g, i, u])
                    seen += 1
            for j in range(Ts):
                for u in range(tcount[b, g, j]):
                    assert bits(by_block[b, g, j, u]) == rows(tiles[b, g, j, u], g, b, j)
    assert seen > 20
    # a table is for unpacked rows: with document starts, tile_index says so
    with pytest.raises(ValueError, match="unpacked"):
        tile_index(jnp.asarray(idx), T, cfg, bq, jnp.zeros((B, T), jnp.int32),
                   table=member_table(jnp.asarray(idx), T, cfg, bq))


# ---- packed documents (document-relative ids; issue #16) -----------------------------------------
def _packed_selection(rng, start, G, cfg, future=0.1):
    """Document-relative selections shaped like top-n's for packed rows (``start`` [B,T] numpy
    document starts): the document's forced initial/local blocks, random other blocks of the
    document at or before the query, now and then a later block of the document or an id past
    Ts (both ignored), -1 in unused slots, random slot order. Row 3 of (b=B-1, g=G-1) selects
    only a later block (sees no key)."""
    B, T = start.shape
    Ts, l = cfg.num_sel_blocks(T), cfg.sel_block
    idx = _top_n_like(rng, np.arange(T)[None, :] - start, G, cfg, future,
                      lambda cur: (cur + 1, Ts + 2))
    idx[B - 1, 3, G - 1, :] = -1
    idx[B - 1, 3, G - 1, 1] = (3 - start[B - 1, 3]) // l + 1
    return jnp.asarray(idx)


def _starts(lengths_per_row):
    return np.stack([np.repeat(np.cumsum([0] + ls[:-1]), ls) for ls in lengths_per_row])


def test_tile_index_packed_lists_the_aligned_blocks_of_each_row():
    """Packed rows: each selected document block j of row t puts the aligned block(s) holding
    its keys [S + j*l', S + (j+1)*l') ∩ [S, t] (S = start(t)) in t's tile list."""
    cfg = dataclasses.replace(TINY, sel_block=12, n_sel=3)
    lengths = [[1, 5, 12, 29, 20, 8], [40, 7, 28]]
    start = _starts(lengths)
    B, T, G, bq, l = 2, 75, 2, 16, cfg.sel_block
    Ts, nqt = cfg.num_sel_blocks(T), -(-T // bq)
    idx = np.array(_packed_selection(np.random.default_rng(4), start, G, cfg))
    blocks, bcount, tiles, tcount = [np.asarray(x) for x in jax.jit(
        lambda i, s: tile_index(i, T, cfg, bq, s))(jnp.asarray(idx), jnp.asarray(start))]
    assert blocks.shape == (B, G, nqt, Ts) and tiles.shape == (B, G, Ts, nqt)
    for b in range(B):
        for g in range(G):
            for i in range(nqt):
                want = set()
                for t in range(i * bq, min((i + 1) * bq, T)):
                    S = start[b, t]
                    for j in idx[b, t, g]:
                        if 0 <= j < Ts:
                            want |= {s // l for s in range(S + j * l, min(S + (j + 1) * l,
                                                                          t + 1))}
                assert list(blocks[b, g, i, :bcount[b, g, i]]) == sorted(want), (b, g, i)
            for u in range(Ts):
                want = [i for i in range(nqt) if u in blocks[b, g, i, :bcount[b, g, i]]]
                assert list(tiles[b, g, u, :tcount[b, g, u]]) == want


@pytest.mark.parametrize("h,G,cfg,D,bs,lengths", [
    # h=1; l'=12 (not a multiple of the 16-key sub-tile), 16-row tiles spanning documents of
    # length 1, < l, = l', not a multiple of l'; each row's last document cut by the row end
    (1, 2, dataclasses.replace(TINY, sel_block=12, n_sel=3), 16,
     BlockSizes(sel_tile_q=16, sel_keys=16), [[1, 5, 12, 29, 20, 8], [40, 7, 28]]),
    # h=2; blocks of 32 keys walked in 2 sub-tiles of 16; n=5 slots (padded to 8)
    (2, 1, dataclasses.replace(TINY, sel_block=32, n_sel=5, n_local=2), 32,
     BlockSizes(sel_tile_q=32, sel_keys=16), [[1, 20, 32, 70, 27], [100, 3, 47]]),
])
def test_tiled_selection_packed_matches_reference_and_gather(h, G, cfg, D, bs, lengths):
    """Packed rows (document-relative ids): the tiled kernels against the float32 reference
    (o, lse, dq, dk, dv <= 2e-5) and the gather kernels on the same ids; then a cotangent on
    one document: no gradient reaches another document's queries or keys."""
    B, T = len(lengths), sum(lengths[0])
    start = _starts(lengths)
    seg_ids = jnp.asarray(np.stack([np.repeat(np.arange(len(ls)), ls) for ls in lengths]))
    seg = semantics.segment_layout(seg_ids, cfg)
    q, k, v, do, gs = _sel_inputs(B, T, h * G, G, D, jax.random.PRNGKey(h + G + 7))
    idx = _packed_selection(np.random.default_rng(h * 10 + G + 1), start, G, cfg)
    scale = 1.0 / math.sqrt(D)

    def run(fwd, bwd):
        @jax.jit
        def f(q, k, v, idx, do, gs, seg):
            o, lse = fwd(q, k, v, idx, cfg, bs, scale, True, seg=seg)
            return (o, lse), bwd(q, k, v, idx, o, lse, do, gs, cfg, bs, scale, True, seg=seg)
        return f
    tiled = run(sel_tiled_forward, sel_tiled_backward)
    (o, lse), grads = tiled(q, k, v, idx, do, gs, seg)
    (o_g, lse_g), grads_g = run(sel_forward, sel_backward)(q, k, v, idx, do, gs, seg)
    o_r, g_r, lse_r = _reference(q, k, v, idx, do, gs, cfg, seg_ids)
    fin = np.isfinite(np.asarray(lse_r))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), fin)
    errs = {}
    for tag, (o_, lse_, g_) in {"": (o_r, lse_r, g_r), "gather ": (o_g, lse_g, grads_g)}.items():
        errs[tag + "o"] = _rel(o, o_)
        errs[tag + "lse"] = _rel(np.asarray(lse)[fin], np.asarray(lse_)[fin])
        errs.update({tag + n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), grads, g_)})
    bad = {k_: f"{e:.2e}" for k_, e in errs.items() if not e <= TOL}
    assert not bad, f"relative error above {TOL}: {bad}"
    heads = slice((G - 1) * h, G * h)  # row 3 of (B-1, G-1) sees no key
    assert not np.isfinite(np.asarray(lse)[B - 1, 3, heads]).any()
    assert np.abs(np.asarray(o)[B - 1, 3, heads]).max() == 0.0
    # cotangent on the fourth document of row 0 only
    s0, L = int(np.cumsum([0] + lengths[0])[3]), lengths[0][3]
    do1 = jnp.zeros_like(do).at[0, s0:s0 + L].set(do[0, s0:s0 + L])
    _, grads1 = tiled(q, k, v, idx, do1, gs, seg)
    for name, g_ in zip(("dq", "dk", "dv"), grads1):
        g_ = np.asarray(g_)
        assert np.abs(g_[0, s0:s0 + L]).sum() > 0, name
        outside = np.concatenate([g_[0, :s0], g_[0, s0 + L:], g_[1]])
        assert np.all(outside == 0.0), name


def _nsa_fwd_bwd(impl, args, cot, cfg, **kw):
    @jax.jit
    def run(args, cot):
        out, vjp = jax.vjp(lambda *a: nsa_attention(*a, cfg, impl=impl, **kw), *args)
        return out, vjp(cot)
    return run(args, cot)


def _assert_nsa_parity(args, cot, cfg, ch, bs=None, block_idx=None, kernel="nsa_sel_tiled_fwd"):
    kw = {} if block_idx is None else {"block_idx": block_idx}
    jaxpr = str(jax.make_jaxpr(lambda *a: nsa_attention(*a, cfg, impl="pallas", block_sizes=bs,
                                                        choices=ch, **kw))(*args))
    assert kernel in jaxpr, f"{kernel} not called"
    out_p, g_p = _nsa_fwd_bwd("pallas", args, cot, cfg, block_sizes=bs, choices=ch, **kw)
    out_r, g_r = _nsa_fwd_bwd("reference", args, cot, cfg, **kw)
    errs = {"out": _rel(out_p, out_r)}
    errs.update({n: _rel(a, b) for n, a, b in zip(NAMES, g_p, g_r)})
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative error above {TOL}: {bad}"


def _nsa_inputs(seed, B, T, h, G, cfg, D=16):
    args = random_inputs(seed, B, T, h * G, G, D, D, cfg)
    cot = jax.random.normal(jax.random.PRNGKey(seed + 100), (B, T, h * G, D))
    return args, cot


def test_full_nsa_tiled_with_kernel_selection():
    """Selection by the fused scoring + top-n kernels, then the tiled selection kernels."""
    args, cot = _nsa_inputs(1, 2, 75, 2, 2, TINY)
    _assert_nsa_parity(args, cot, TINY, KernelChoices(sel_impl="tiled"),
                       BlockSizes(sel_tile_q=16))


def test_full_nsa_tiled_with_given_block_idx():
    """h=6, default 64-row tiles (T=70: two tiles, the second partial), given ids with -1
    slots, future blocks, disjoint rows in a tile and rows without a visible key."""
    B, T, h, G = 2, 70, 6, 1
    args, cot = _nsa_inputs(2, B, T, h, G, TINY)
    idx = _selection(np.random.default_rng(5), B, T, G, TINY)
    _assert_nsa_parity(args, cot, TINY, KernelChoices(sel_impl="tiled"), block_idx=idx)


def test_full_nsa_gather_still_selectable():
    """sel_impl="gather" keeps the per-query kernels (auto would pick tiled at this T)."""
    args, cot = _nsa_inputs(3, 1, 75, 2, 2, TINY)
    _assert_nsa_parity(args, cot, TINY, KernelChoices(sel_impl="gather"), kernel="nsa_sel_fwd")


def test_auto_dispatch_by_sequence_length():
    tiled, gather = (sel_tiled_forward, sel_tiled_backward), (sel_forward, sel_backward)
    auto = KernelChoices(sel_impl="auto", sel_tiled_max_t=100)
    assert selection_kernels(auto, 100) == tiled
    assert selection_kernels(auto, 101) == gather
    assert selection_kernels(None, 4096) == tiled  # the default threshold
    assert selection_kernels(None, 4097) == gather
    assert selection_kernels(KernelChoices(sel_impl="gather"), 16) == gather
    assert selection_kernels(KernelChoices(sel_impl="tiled"), 1 << 20) == tiled
    from nsa_jax.pallas.selection_block import sel_backward_block, sel_forward_block
    bf = jnp.bfloat16   # sel_fwd auto: block for small groups of 16-bit rows only
    assert selection_kernels(None, 8192, h=6, dtype=bf) == (sel_forward_block, sel_backward_block)
    # sel_dq auto follows the resolved forward (one shared index), never under sel_bwd atomic
    assert selection_kernels(KernelChoices(sel_fwd="query"), 8192, h=6, dtype=bf)[1] \
        is sel_backward
    assert selection_kernels(KernelChoices(sel_bwd="atomic"), 8192, h=6, dtype=bf) == \
        (sel_forward_block, sel_backward)
    assert selection_kernels(KernelChoices(sel_dq="block"), 8192, h=16, dtype=bf) == \
        (gather[0], sel_backward_block)
    assert selection_kernels(None, 8192, h=16, dtype=bf) == gather
    assert selection_kernels(None, 8192, h=6, dtype=jnp.float32) == gather
    assert selection_kernels(None, 8192, h=6) == gather


@pytest.mark.parametrize("field,value", [("sel_tile_q", 48), ("sel_tile_q", 8)])
def test_block_sizes_reject_bad_tiled_values(field, value):
    with pytest.raises(ValueError, match=f"BlockSizes.{field}"):
        BlockSizes(**{field: value})


# ---- GPU (bf16 compiled kernels vs the float32 reference) ---------------------------------------
GPU_CFG = NSAConfig()  # l=32, d=16, l'=64, n=16, w=512
SHAPE_125M = (12, 2, 64)  # Hq, G, D


def _gpu_inputs(seed, T, B=2):
    Hq, G, D = SHAPE_125M
    args = random_inputs(seed, B, T, Hq, G, D, D, GPU_CFG, dtype=jnp.bfloat16)
    cot = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, T, Hq, D)).astype(jnp.bfloat16)
    idx = jax.jit(lambda q, kc: ref.select_blocks(q, kc, GPU_CFG))(
        args[0].astype(jnp.float32), args[1].astype(jnp.float32))
    return args, cot, idx


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 8192])
def test_gpu_tiled_selection_bf16(T):
    """Selection branch alone: tiled fwd + bwd (gate scale gs) against the float32 reference."""
    args, cot, idx = _gpu_inputs(T, T)
    q, k, v = args[0], args[3], args[4]
    gs = args[7][..., 1].astype(jnp.float32)
    bs = BlockSizes()
    scale = 1.0 / math.sqrt(q.shape[-1])

    @jax.jit
    def run(q, k, v, idx, do, gs):
        o, lse = sel_tiled_forward(q, k, v, idx, GPU_CFG, bs, scale, use_interpret())
        return o, sel_tiled_backward(q, k, v, idx, o, lse, do, gs, GPU_CFG, bs, scale,
                                     use_interpret())
    o, grads = run(q, k, v, idx, cot, gs)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    G = k.shape[2]
    h = q.shape[2] // G
    errs = {}
    for g in range(G):  # one group at a time bounds the reference's T x T memory
        hs, gg = slice(g * h, (g + 1) * h), slice(g, g + 1)
        o_r, g_r, _ = _reference(f32[0][:, :, hs], f32[1][:, :, gg], f32[2][:, :, gg],
                                 idx[:, :, gg], cot[:, :, hs].astype(jnp.float32), gs[:, :, hs],
                                 GPU_CFG)
        got = (o[:, :, hs], grads[0][:, :, hs], grads[1][:, :, gg], grads[2][:, :, gg])
        for n, a, b_ in zip(("o", "dq", "dk", "dv"), got, (o_r,) + tuple(g_r)):
            errs[f"{n}{g}"] = rrmse(a, b_)
    print(T, {k_: f"{e:.2e}" for k_, e in errs.items()})
    bad = {k_: e for k_, e in errs.items() if not e <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 8192])
def test_gpu_full_nsa_tiled_bf16(T):
    """Full NSA (impl="pallas", sel_impl="tiled") in bf16 against the float32 reference with the
    same block ids; output and all 8 input gradients, relative RMSE <= 5e-3."""
    args, cot, idx = _gpu_inputs(T + 7, T)
    out, grads = _nsa_fwd_bwd("pallas", args, cot, GPU_CFG, block_idx=idx,
                              choices=KernelChoices(sel_impl="tiled"))
    assert out.dtype == jnp.bfloat16
    Hq, G, _ = SHAPE_125M
    h = Hq // G
    f32 = [a.astype(jnp.float32) for a in args]
    errs = {}
    outs, ref_grads = [], [[] for _ in NAMES]
    for g in range(G):
        hs, gg = slice(g * h, (g + 1) * h), slice(g, g + 1)
        part = [f32[0][:, :, hs]] + [a[:, :, gg] for a in f32[1:7]] + [f32[7][:, :, hs]]
        o_r, g_r = _nsa_fwd_bwd("reference", part, cot[:, :, hs].astype(jnp.float32), GPU_CFG,
                                block_idx=idx[:, :, gg])
        outs.append(o_r)
        for lst, x in zip(ref_grads, g_r):
            lst.append(x)
    errs["out"] = rrmse(out, jnp.concatenate(outs, 2))
    for n, a, lst in zip(NAMES, grads, ref_grads):
        errs[n] = rrmse(a, jnp.concatenate(lst, 2))
    print(T, {k_: f"{e:.2e}" for k_, e in errs.items()})
    bad = {k_: e for k_, e in errs.items() if not e <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"


@pytest.mark.parametrize("packed", [False, True])
def test_tile_index_lists_each_single_row_block_pair(packed):
    """Each batch row holds one (query t, block j) pair and nothing else, so t's tile list is
    exactly that pair's blocks: no other row's selection hides a missing or an extra one (the
    union tests above do). For every t, j = 0 .. t's own block + 1 (the next block: unused),
    unpacked at T = 65 = 4 * 16 + 1 (query 64, alone in the last tile, selects block 4 that
    starts at it) and packed at l' = 12 (a row at its block's first key; a row at an aligned
    boundary inside an unaligned document block, its key t in the next aligned block; an
    aligned document, whose blocks are aligned blocks; the last tile's last query 72 = 6 * 12)."""
    bq = 16
    if packed:
        cfg = dataclasses.replace(TINY, sel_block=12)
        start = _starts([[30, 5, 12, 20, 6]])[0]
    else:
        cfg = TINY
        start = np.zeros(65, np.int64)
    T, l = len(start), cfg.sel_block
    Ts, nqt = cfg.num_sel_blocks(T), -(-T // bq)
    pairs = [(t, j) for t in range(T) for j in range((t - start[t]) // l + 2)]
    E = len(pairs)
    idx = np.full((E, T, 1, 1), -1, np.int32)
    for e, (t, j) in enumerate(pairs):
        idx[e, t, 0, 0] = j
    args = (jnp.asarray(idx),) + ((jnp.asarray(np.broadcast_to(start, (E, T))),) if packed
                                  else ())
    blocks, bcount, tiles, tcount = [np.asarray(x) for x in jax.jit(
        lambda *a: tile_index(a[0], T, cfg, bq, *a[1:]))(*args)]
    assert blocks.shape == (E, 1, nqt, Ts) and tiles.shape == (E, 1, Ts, nqt)
    for e, (t, j) in enumerate(pairs):
        last = min((t // bq + 1) * bq, T) - 1
        if packed:
            S = start[t]
            want = sorted({s // l for s in range(S + j * l, min(S + (j + 1) * l, t + 1))})
        else:
            want = [j] if j < Ts and j * l <= last else []
        for i in range(nqt):
            got = list(blocks[e, 0, i, :bcount[e, 0, i]])
            assert got == (want if i == t // bq else []), (t, j, i, got, want)
        for u in range(Ts):
            got = list(tiles[e, 0, u, :tcount[e, 0, u]])
            assert got == ([t // bq] if u in want else []), (t, j, u, got)


def test_tiled_kernels_take_4_warps_at_128_wide_heads():
    """The three tiled kernels (64 queries of one head per tile) take one warpgroup each at bf16
    128-wide heads -- the op at the bench shape, 4k / B=4: 19.3 against 31.3 ms at 8 warps on an
    H100 (bench/NOTES.md, thirtieth session) -- and follow ``num_warps``."""
    names = {"nsa_sel_tiled_fwd", "nsa_sel_tiled_bwd_dq", "nsa_sel_tiled_bwd_dkv"}

    def warps(dtype, D, bs):
        B, T, Hq, G = 1, 64, 4, 1
        q = jnp.zeros((B, T, Hq, D), dtype)
        k = jnp.zeros((B, T, G, D), dtype)
        idx = jnp.zeros((B, T, G, TINY.n_sel), jnp.int32)

        def f(q, k, v):
            o, lse = sel_tiled_forward(q, k, v, idx, TINY, bs, 0.1, True)
            return sel_tiled_backward(q, k, v, idx, o, lse, q, None, TINY, bs, 0.1, True)
        return kernel_warps(f, q, k, k, names=names)
    assert_launch_follows_num_warps(warps, BlockSizes.for_shape(16, 128))
