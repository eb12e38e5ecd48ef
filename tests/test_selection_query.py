"""Query tiles of the query-major selection kernels (``BlockSizes.sel_queries``,
``nsa_jax/pallas/selection_query.py``): the shared-block order of ``tile_slots``, and the
forward, dQ and both dK/dV variants against the float32 reference (interpret mode, <= 2e-5),
unpacked and packed rows, T not a multiple of the tile."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from nsa_jax.nsa import semantics
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.selection_query import tile_slots
from test_pallas import TINY, _assert_parity, _inputs, _rel
from test_pallas_tiled import (_packed_selection, _reference, _sel_inputs, _selection,
                               _starts)

TOL = 2e-5
QUERY = KernelChoices(sel_impl="gather", sel_fwd="query", sel_dq="query")


def _check_tile_slots(idx, qt, ids, counts, pos):
    """Every query keeps its valid ids (as a set); the first counts[0] of each tile's rows are
    the same blocks (by first key ``pos``): exactly those every real query of the tile selected;
    counts[1] is the number of the query's other ids, which follow them."""
    B, T, G, n = idx.shape
    C = -(-T // qt)
    assert ids.shape == (B, C * qt, G, n) and counts.shape == (B, C * qt, G, 2)
    for b in range(B):
        for c in range(C):
            ts = range(c * qt, min((c + 1) * qt, T))
            for g in range(G):
                nsh = counts[b, ts[0], g, 0]
                sets = {t: {int(pos(b, t, j)) for j in idx[b, t, g] if j >= 0} for t in ts}
                common = set.intersection(*sets.values())
                lead = [int(pos(b, ts[0], j)) for j in ids[b, ts[0], g, :nsh]]
                assert sorted(lead) == sorted(common), (b, c, g)
                for t in ts:
                    row = ids[b, t, g]
                    got = [int(j) for j in row if j >= 0]
                    assert sorted(got) == sorted(int(j) for j in idx[b, t, g] if j >= 0)
                    assert [int(pos(b, t, j)) for j in row[:nsh]] == lead
                    assert (row[len(got):] == -1).all() and (row[:len(got)] >= 0).all()
                    assert tuple(counts[b, t, g]) == (nsh, len(got) - nsh)
            for t in range(T, (c + 1) * qt):   # the last tile's padding
                assert (ids[b, t] == -1).all() and (counts[b, t, :, 1] == 0).all()


@pytest.mark.parametrize("qt", [2, 4, 8])
def test_tile_slots_puts_the_shared_blocks_first(qt):
    cfg = dataclasses.replace(TINY, n_sel=5)
    B, T, G = 2, 75, 2
    idx = _selection(np.random.default_rng(qt), B, T, G, cfg)
    ids, counts = [np.asarray(x) for x in jax.jit(
        lambda i: tile_slots(i, qt, cfg.sel_block))(jnp.asarray(idx))]
    _check_tile_slots(idx, qt, ids, counts, lambda b, t, j: j)
    assert counts[..., 0].max() >= 2   # the forced blocks are shared


def test_tile_slots_packed_compares_first_keys():
    """Packed rows: the same document-relative id of two documents is two blocks."""
    cfg = dataclasses.replace(TINY, sel_block=12, n_sel=3)
    lengths = [[1, 5, 12, 29, 20, 8], [40, 7, 28]]
    start = _starts(lengths)
    idx = np.array(_packed_selection(np.random.default_rng(4), start, 2, cfg))
    ids, counts = [np.asarray(x) for x in jax.jit(
        lambda i, s: tile_slots(i, 4, cfg.sel_block, s))(jnp.asarray(idx), jnp.asarray(start))]
    _check_tile_slots(idx, 4, ids, counts, lambda b, t, j: start[b, t] + j * cfg.sel_block)


@pytest.mark.parametrize("h,G,qt,sel_bwd", [(1, 2, 4, "inverted"), (2, 2, 2, "inverted"),
                                            (6, 1, 8, "inverted"), (16, 1, 4, "inverted"),
                                            (2, 2, 4, "atomic")])
def test_query_tiles_full_op_parity(h, G, qt, sel_bwd):
    """The whole op (output and all 8 gradients) through the query-major kernels with query
    tiles; T = 75 is a multiple of neither l' nor the tile."""
    args, cot = _inputs(h * 10 + G + qt, 2 if h < 6 else 1, 75, h * G, G, TINY)
    _assert_parity(args, cot, TINY, block_sizes=BlockSizes(sel_queries=qt),
                   choices=dataclasses.replace(QUERY, sel_bwd=sel_bwd))


def test_query_tiles_default_config_parity():
    """Paper defaults (l'=64, n=16) at T = 1100 with 4-query tiles: the selection chooses among
    candidates, so tiles share the forced blocks and differ in the rest."""
    cfg = NSAConfig()
    args, cot = _inputs(3, 1, 1100, 4, 2, cfg)
    _assert_parity(args, cot, cfg, block_sizes=BlockSizes(sel_queries=4), choices=QUERY)


@pytest.mark.parametrize("qt,packed", [(4, False), (8, True)])
def test_query_tiles_given_ids_match_reference(qt, packed):
    """Given ids with -1 slots, blocks after the query, rows without a visible key and (packed)
    document-relative ids: o, lse, dq, dk, dv of the kernels against the reference."""
    h, G, D = 2, 2, 16
    cfg = dataclasses.replace(TINY, sel_block=12, n_sel=3) if packed else TINY
    lengths = [[1, 5, 12, 29, 20, 8], [40, 7, 28]]
    B, T = 2, 75
    rng = np.random.default_rng(qt)
    q, k, v, do, gs = _sel_inputs(B, T, h * G, G, D, jax.random.PRNGKey(qt))
    seg = seg_ids = None
    if packed:
        idx = _packed_selection(rng, _starts(lengths), G, cfg)
        seg_ids = jnp.asarray(np.stack([np.repeat(np.arange(len(ls)), ls) for ls in lengths]))
        seg = semantics.segment_layout(seg_ids, cfg)
    else:
        idx = jnp.asarray(_selection(rng, B, T, G, cfg))
    bs = BlockSizes(sel_queries=qt, sel_keys=16)
    scale = 1.0 / math.sqrt(D)

    @jax.jit
    def run(q, k, v, idx, do, gs, seg):
        o, lse = sel_forward(q, k, v, idx, cfg, bs, scale, True, seg=seg)
        return (o, lse), sel_backward(q, k, v, idx, o, lse, do, gs, cfg, bs, scale, True,
                                      seg=seg)
    (o, lse), grads = run(q, k, v, idx, do, gs, seg)
    o_r, g_r, lse_r = _reference(q, k, v, idx, do, gs, cfg, seg_ids)
    fin = np.isfinite(np.asarray(lse_r))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), fin)
    errs = {"o": _rel(o, o_r), "lse": _rel(np.asarray(lse)[fin], np.asarray(lse_r)[fin])}
    errs.update({n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), grads, g_r)})
    bad = {k_: f"{e:.2e}" for k_, e in errs.items() if not e <= TOL}
    assert not bad, f"relative error above {TOL}: {bad}"


def test_sel_queries_rejects_bad_values():
    with pytest.raises(ValueError, match="BlockSizes.sel_queries"):
        BlockSizes(sel_queries=3)
