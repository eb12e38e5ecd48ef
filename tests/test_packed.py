"""Packed documents (segment_ids): a packed row equals each document run alone (reference)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_bruteforce import brute_nsa
from nsa_jax.nsa import NSAConfig, semantics
from nsa_jax.nsa import nsa_attention as _nsa_attention
from nsa_jax.nsa import select_blocks as _select_blocks
from nsa_jax.nsa.compression import compress, compress_naive
from nsa_testutil import rel_err
from packed_util import NAMES, alone, cotangent, packed_inputs, segments

nsa_attention = jax.jit(_nsa_attention, static_argnames=("cfg", "impl"))
select_blocks = jax.jit(_select_blocks, static_argnames=("cfg", "impl"))

CFG = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8)
# lengths 1, < l, = l', not a multiple of l', and a last document cut by the row end;
# row 2: one long document, then two short ones
LENGTHS = [[1, 5, 16, 21, 13], [40, 7, 9]]


def test_segment_layout_small():
    seg = segments([[1, 5, 16, 21, 13]])
    lay = semantics.segment_layout(seg, CFG)
    starts = np.repeat([0, 1, 6, 22, 43], [1, 5, 16, 21, 13])
    np.testing.assert_array_equal(lay.start[0], starts)
    np.testing.assert_array_equal(lay.rel[0], np.arange(56) - starts)
    # Tc per document: 0, 0, 3, 4, 2 -> offsets 0, 0, 0, 3, 7; 9 of Tc(56) = 13 slots used
    np.testing.assert_array_equal(lay.cmp_lo[0], np.repeat([0, 0, 0, 3, 7], [1, 5, 16, 21, 13]))
    np.testing.assert_array_equal(lay.cmp_ok[0], np.arange(13) < 9)
    np.testing.assert_array_equal(lay.cmp_src[0, :9], [6, 10, 14, 22, 26, 30, 34, 43, 47])


def test_reference_packed_matches_bruteforce():
    args, seg = packed_inputs(0, LENGTHS, 4, 2, 8, 6, CFG)
    c = CFG
    want, want_sel = brute_nsa(*[np.asarray(a) for a in args], c.block_l, c.stride_d,
                               c.sel_block, c.n_sel, c.window, seg=np.asarray(seg))
    np.testing.assert_array_equal(np.asarray(select_blocks(args[0], args[1], CFG,
                                                           segment_ids=seg)), want_sel)
    got = nsa_attention(*args, CFG, segment_ids=seg)
    assert rel_err(got, want) < 1e-5


def _check_packed_equals_alone(attn, args, seg, cfg, tol):
    """Values and every input's gradient of a packed batch equal the documents run alone."""
    ct = cotangent(1, args[0].shape[:3] + (args[6].shape[-1],))
    out, vjp = jax.vjp(lambda *a: attn(*a, seg), *args)
    grads = vjp(ct)
    for b in range(seg.shape[0]):
        used = 0
        for start, L, off, doc in alone(args, seg, cfg, b):
            o1, vjp1 = jax.vjp(lambda *a: attn(*a, None), *doc)
            g1 = vjp1(ct[b:b + 1, start:start + L])
            assert rel_err(out[b:b + 1, start:start + L], o1) < tol, (b, start, L)
            Tc = doc[1].shape[1]
            used = off + Tc
            for name, g, ga in zip(NAMES, grads, g1):
                gp = g[b:b + 1, off:off + Tc] if name in ("k_cmp", "v_cmp") \
                    else g[b:b + 1, start:start + L]
                assert rel_err(gp, ga) < tol or np.abs(np.asarray(ga)).max() == 0 and \
                    np.abs(np.asarray(gp)).max() < tol, (b, start, L, name)
        for i in (1, 2):  # padding slots: no query sees them
            assert np.all(np.asarray(grads[i][b, used:]) == 0)


def test_reference_packed_equals_each_document_alone():
    args, seg = packed_inputs(2, LENGTHS[:1], 4, 2, 8, 8, CFG)
    attn = jax.jit(lambda *a: _nsa_attention(*a[:8], CFG, segment_ids=a[8]))
    _check_packed_equals_alone(attn, args, seg, CFG, 2e-5)


def test_no_gradient_crosses_a_document_boundary():
    """Cotangent on one document only: every other document's inputs get exactly zero."""
    args, seg = packed_inputs(3, [LENGTHS[0]], 4, 2, 8, 8, CFG)
    docs = alone(args, seg, CFG, 0)
    start, L, off, doc = docs[3]
    ct = jnp.zeros(args[0].shape).at[:, start:start + L].set(1.0)
    _, vjp = jax.vjp(lambda *a: nsa_attention(*a, CFG, segment_ids=seg), *args)
    grads = vjp(ct)
    Tc = doc[1].shape[1]
    for name, g in zip(NAMES, grads):
        g = np.asarray(g)
        if name in ("k_cmp", "v_cmp"):
            outside = np.concatenate([g[:, :off], g[:, off + Tc:]], axis=1)
        else:
            outside = np.concatenate([g[:, :start], g[:, start + L:]], axis=1)
            assert np.abs(g[:, start:start + L]).sum() > 0, name
        assert np.all(outside == 0.0), name


def test_compress_with_sources_matches_each_document():
    B, T, G, D, H = 1, 56, 2, 4, 8
    ks = jax.random.split(jax.random.PRNGKey(5), 6)
    x = jax.random.normal(ks[0], (B, T, G, D))
    w = (jax.random.normal(ks[1], (CFG.block_l, D)), jax.random.normal(ks[2], (CFG.block_l * D, H)),
         jax.random.normal(ks[3], (H,)), jax.random.normal(ks[4], (H, D)),
         jax.random.normal(ks[5], (D,)))
    seg = segments([LENGTHS[0]])
    lay = semantics.segment_layout(seg, CFG)
    got = compress(x, *w, CFG, src=lay.cmp_src)
    for start, L, off, _ in alone((x,) * 8, seg, CFG, 0):
        if L >= CFG.block_l:
            want = compress_naive(x[:, start:start + L], *w, CFG)
            assert rel_err(got[:, off:off + want.shape[1]], want) < 1e-5


@pytest.mark.parametrize("bad, msg", [
    (lambda s: s[:, ::-1], "non-decreasing"),
    (lambda s: s[:, :-1], "shape"),
    (lambda s: s.astype(jnp.float32), "integer"),
])
def test_bad_segment_ids_name_the_argument(bad, msg):
    args, seg = packed_inputs(0, [[20, 20]], 4, 2, 8, 8, CFG)
    with pytest.raises(ValueError, match="segment_ids") as e:
        _nsa_attention(*args, CFG, segment_ids=bad(seg))
    assert msg in str(e.value)


def _pallas_vs_reference(args, seg, cfg, ct, kernel=None, **kw):
    """Output and the 8 input gradients through impl="pallas" and the reference, packed
    (``kernel``: name of a Pallas kernel the pallas forward + backward must run)."""
    def fb(impl, **kw):
        @jax.jit
        def run(args, seg, ct):
            o, vjp = jax.vjp(lambda *a: _nsa_attention(*a, cfg, impl=impl, segment_ids=seg,
                                                       **kw), *args)
            return o, vjp(ct)
        return run
    pal = fb("pallas", **kw)
    if kernel is not None:   # the exact kernel name (nsa_sel_fwd is not nsa_sel_fwd_block)
        assert re.search(rf"name={kernel}\s", str(jax.make_jaxpr(pal)(args, seg, ct))), \
            f"{kernel} not called"
    got, want = pal(args, seg, ct), fb("reference")(args, seg, ct)
    for name, g, w in zip(("out",) + NAMES, (got[0],) + got[1], (want[0],) + want[1]):
        assert np.abs(np.asarray(w)).max() > 0, name  # every input gets a gradient
        assert rel_err(g, w) <= 2e-5, name
    return pal


@pytest.mark.parametrize("sel_impl, kernel", [("auto", "nsa_sel_tiled_fwd"),
                                              ("gather", "nsa_sel_fwd")])
def test_pallas_packed_matches_reference_and_no_gradient_crosses(sel_impl, kernel):
    """h=2, default kernels (selection "auto" -> the tiled kernels at this T, packed rows
    too) and the gather selection kernels (inverted dK/dV) on the rows above (documents of
    length 1, < l, = l', not a multiple of l', a row ending mid-document; tiles spanning several
    documents); the reference is tied to each document alone by the tests above. Then a
    cotangent on one document: every other document's inputs get exactly 0."""
    from nsa_jax.nsa import KernelChoices
    args, seg = packed_inputs(4, LENGTHS, 4, 2, 8, 8, CFG)
    pal = _pallas_vs_reference(args, seg, CFG, cotangent(5, args[0].shape), kernel=kernel,
                               choices=KernelChoices(sel_impl=sel_impl, sel_fwd="query"))
    start, L, off, doc = alone(args, seg, CFG, 0)[3]
    Tc = doc[1].shape[1]
    _, grads = pal(args, seg, jnp.zeros(args[0].shape).at[0, start:start + L].set(1.0))
    for name, g in zip(NAMES, grads):
        g = np.asarray(g)
        if name in ("k_cmp", "v_cmp"):
            inside = g[0, off:off + Tc]
            outside = np.concatenate([g[0, :off], g[0, off + Tc:], g[1].reshape(-1, *g.shape[2:])])
        else:
            inside = g[0, start:start + L]
            outside = np.concatenate([g[0, :start], g[0, start + L:], g[1]])
        assert np.abs(inside).sum() > 0, name
        assert np.all(outside == 0.0), name


@pytest.mark.parametrize("choice, kernel", [
    (dict(sel_impl="gather", sel_bwd="atomic"), "nsa_sel_bwd_atomic"),
    (dict(sel_impl="gather", sel_fwd="block", sel_dq="block"), "nsa_sel_bwd_block"),
    (dict(sel_impl="tiled"), "nsa_sel_tiled_bwd_dkv")])
def test_pallas_packed_small_tiles_general_scoring(choice, kernel):
    """h=1, l'/d = 3 (general scoring path), several compressed-key tiles (a document whose
    slots start past the first tile), 16-row tiles, split compressed dK/dV; the selection by
    the gather kernels with atomic dK/dV, by the block-major pair (key ranges that start off
    the grid; a 12-key block in one 16-key sub-tile), or by the tiled kernels with 16-query
    tiles that span documents (starts 70, 73, 103: not multiples of l' = 12, itself not a
    multiple of the 16-key sub-tile)."""
    from nsa_jax.nsa import KernelChoices
    from nsa_jax.pallas import BlockSizes
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=12, n_sel=3, window=8)
    args, seg = packed_inputs(6, [[70, 3, 30, 17]], 2, 2, 8, 8, cfg)
    bs = BlockSizes(cmp_bwd_keys=16, cmp_keys=16, cmp_rows=16, score_sel=16, sel_keys=16,
                    sel_tile_q=16)
    ch = KernelChoices(cmp_bwd_split=2, **choice)
    _pallas_vs_reference(args, seg, cfg, cotangent(7, args[0].shape), kernel=kernel,
                         block_sizes=bs, choices=ch)


@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
def test_pallas_packed_grouped_cmp_matches_reference(grouping):
    """KernelChoices(cmp_attn="xla"): packed compressed attention as a grouped causal attention
    over the slots with the documents' slot mask (``cmp_grouped._packed``, the CPU twin of the
    cuDNN path): output, the base-2 lse that scoring takes, and the whole op's 8 gradients, in
    both head orders (``cmp_grouping``)."""
    from nsa_jax.nsa import KernelChoices
    from nsa_jax.pallas import BlockSizes
    from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped
    from nsa_jax.pallas.common import POS_INF
    from nsa_jax.pallas.compressed import cmp_forward
    args, seg = packed_inputs(8, LENGTHS, 4, 2, 8, 8, CFG)
    lay = semantics.segment_layout(seg, CFG)
    q, kc, vc = args[:3]
    o, lse = jax.jit(lambda *a: cmp_attention_grouped(*a, CFG, "xla", jax.lax.Precision.HIGHEST,
                                                      lay, grouping))(q, kc, vc)
    o_p, want = cmp_forward(q, kc, vc, CFG, BlockSizes(), 1 / np.sqrt(8), True, seg=lay)
    assert rel_err(o, o_p) <= 2e-5
    lse, want = np.asarray(lse), np.asarray(want)
    np.testing.assert_array_equal(lse == POS_INF, want == POS_INF)
    fin = want != POS_INF
    np.testing.assert_allclose(lse[fin], want[fin], rtol=0, atol=2e-5)
    pal = _pallas_vs_reference(args, seg, CFG, cotangent(9, q.shape),
                               choices=KernelChoices(cmp_attn="xla", cmp_grouping=grouping))
    jaxpr = str(jax.make_jaxpr(pal)(args, seg, cotangent(9, q.shape)))
    assert "nsa_cmp_scores" in jaxpr and "nsa_cmp_fwd" not in jaxpr   # the grouped path ran


@pytest.mark.parametrize("layout", ["rows", "loop"])
def test_pallas_packed_scores_long_documents(layout):
    """Packed scoring + top-n over documents long enough that whole scoring steps (64 slots at
    d = 4) precede a tile's first query (the steps that skip the causal mask), one starting
    mid-tile: scores and ids equal the reference's; h = 3 pads to 4 head slots in the rows
    layout, and runs as 3 looped heads of 16-query tiles in the loop layout."""
    from nsa_jax.nsa import KernelChoices
    from nsa_jax.nsa import reference as ref
    from nsa_jax.pallas import BlockSizes, block_scores_pallas, select_blocks_pallas
    args, seg = packed_inputs(9, [[301, 5, 330]], 6, 2, 8, 8, CFG)
    q, kc = args[0], args[1]
    lay = semantics.segment_layout(seg, CFG)
    T = q.shape[1]
    kw = dict(choices=KernelChoices(score_heads=layout), block_sizes=BlockSizes(score_q=16))
    want = ref.block_scores(ref.cmp_probs(q, kc, CFG, lay), T, CFG, lay)
    got = jax.jit(lambda a, b, s: block_scores_pallas(a, b, CFG, segment_ids=s, **kw))(q, kc,
                                                                                       seg)
    assert rel_err(got, want) <= 1e-6
    ids = jax.jit(lambda a, b, s: select_blocks_pallas(a, b, CFG, segment_ids=s, **kw))(q, kc,
                                                                                       seg)
    np.testing.assert_array_equal(np.asarray(ids),
                                  np.asarray(ref.select_blocks(q, kc, CFG, lay)))


def test_pallas_packed_block_major_key_ranges_in_two_sub_tiles():
    """The block-major pair with l' = 32 walked in two 16-key sub-tiles (BlockSizes.sel_keys =
    16): key ranges that start at an unaligned block's first key put their second sub-tile
    across the aligned boundary and near the row end (documents starting at 0, 37, 70, 71, 109;
    the last one cut by the row end)."""
    from nsa_jax.nsa import KernelChoices
    from nsa_jax.pallas import BlockSizes
    cfg = NSAConfig(block_l=16, stride_d=8, sel_block=32, n_sel=3, window=16)
    args, seg = packed_inputs(8, [[37, 33, 1, 38, 20]], 2, 2, 8, 8, cfg)
    bs = BlockSizes(cmp_bwd_keys=16, cmp_keys=16, cmp_rows=16, score_sel=16, sel_keys=16,
                    sel_rows=16, sel_dq_rows=16, sel_chunk=5)
    ch = KernelChoices(sel_impl="gather", sel_fwd="block", sel_dq="block")
    _pallas_vs_reference(args, seg, cfg, cotangent(9, args[0].shape), kernel="nsa_sel_bwd_block",
                         block_sizes=bs, choices=ch)
