"""Parity of the Pallas NSA kernels (``impl="pallas"``, interpret mode on the CPU) with the
pure-JAX reference: outputs and gradients w.r.t. every input, float32, relative error <= 2e-5."""
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig, nsa_attention, select_blocks
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes, block_scores_pallas, select_blocks_pallas
from nsa_jax.pallas.common import LN2
from nsa_jax.pallas.compressed import cmp_attention
from nsa_jax.pallas.selection import inverted_index, selection_attention
from nsa_testutil import kernel_warps

TOL = 2e-5
TINY = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1, n_local=1)
NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")


def _inputs(seed, B, T, Hq, G, cfg, Dk=16, Dv=None):
    Dv = Dv or Dk
    ks = jax.random.split(jax.random.PRNGKey(seed), 9)
    Tc = cfg.num_cmp_blocks(T)
    n = lambda k, s: jax.random.normal(k, s, jnp.float32)
    args = (n(ks[0], (B, T, Hq, Dk)), n(ks[1], (B, Tc, G, Dk)), n(ks[2], (B, Tc, G, Dv)),
            n(ks[3], (B, T, G, Dk)), n(ks[4], (B, T, G, Dv)), n(ks[5], (B, T, G, Dk)),
            n(ks[6], (B, T, G, Dv)), jax.nn.sigmoid(n(ks[7], (B, T, Hq, 3))))
    return args, n(ks[8], (B, T, Hq, Dv))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite values in the kernel result"
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb > 0 else float(np.linalg.norm(a))


def _fwd_bwd(impl, args, cot, cfg, **kw):
    @jax.jit
    def run(args, cot):
        out, vjp = jax.vjp(lambda *a: nsa_attention(*a, cfg, impl=impl, **kw), *args)
        return out, vjp(cot)
    return run(args, cot)


def _assert_parity(args, cot, cfg, **kw):
    out_p, g_p = _fwd_bwd("pallas", args, cot, cfg, **kw)
    kw.pop("block_sizes", None)  # tiles are pallas-only; choices are accepted (and ignored)
    out_r, g_r = _fwd_bwd("reference", args, cot, cfg, **kw)
    errs = {"out": _rel(out_p, out_r)}
    errs.update({n: _rel(a, b) for n, a, b in zip(NAMES, g_p, g_r)})
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative error above {TOL}: {bad}"
    # the gradients that matter are not trivially zero
    for name, g in zip(NAMES, g_r):
        i = NAMES.index(name)
        branch = {1: "cmp", 2: "cmp", 3: "slc", 4: "slc", 5: "win", 6: "win"}.get(i)
        if (branch is None or branch in cfg.branches) and g.size:
            assert float(jnp.max(jnp.abs(g))) > 0, f"reference gradient of {name} is zero"


@pytest.mark.parametrize("h,G,B", [(1, 2, 2), (2, 2, 1), (6, 1, 1), (16, 1, 1)])
def test_parity_tiny_config(h, G, B):
    """l=8, d=4, l'=16, n=4, w=16; T=75 is not a multiple of l' (partial last block)."""
    args, cot = _inputs(h * 10 + G, B, 75, h * G, G, TINY)
    _assert_parity(args, cot, TINY)


def test_parity_default_config():
    """Paper defaults (l=32, d=16, l'=64, n=16, w=512) with T=1100 > n*l', so top-n really
    chooses among candidates; T is not a multiple of l'."""
    cfg = NSAConfig()
    args, cot = _inputs(1, 1, 1100, 4, 2, cfg)
    _assert_parity(args, cot, cfg)


_GEN = dataclasses.replace(TINY, sel_block=12)  # l'/d = 3: the general (dot) scoring path


# Both layouts of one input share the reference scores, the reference ids and the default
# (auto) public path, so they run in one case (each layout's kernels still compile and run).
@pytest.mark.parametrize("cfg,T,h,G,layouts", [
    (TINY, 600, 2, 2, ("rows", "loop")),  # > score_sel selection blocks: several scoring steps,
                                          # zero tiles
    (NSAConfig(), 1100, 6, 1, ("loop", "rows")),
    (NSAConfig(block_l=16, stride_d=8, sel_block=32, n_sel=5, n_init=0, n_local=0), 300, 3, 1,
     ("loop",)),
    (dataclasses.replace(TINY, n_sel=6, n_init=2, n_local=3), 40, 1, 1, ("rows",)),  # Ts=3 < n_sel
    (_GEN, 400, 3, 1, ("loop", "rows")),
])
def test_block_scores_and_selection_exact(cfg, T, h, G, layouts):
    """Both scoring tile layouts (``KernelChoices.score_heads``): (query, head) rows with h
    padded to a power of two, or 16-query tiles of one head with the heads looped per step
    (several tiles, a last partial one)."""
    args, _ = _inputs(T + h, 1, T, h * G, G, cfg)
    q, kc = args[0], args[1]
    bs = BlockSizes(score_q=16)
    # the reference jitted: one compile, not op-by-op dispatch (test speed only)
    s_ref = jax.jit(lambda a, b: ref.block_scores(ref.cmp_probs(a, b, cfg), T, cfg))(q, kc)
    i_ref = jax.jit(lambda a, b: ref.select_blocks(a, b, cfg))(q, kc)
    for layout in layouts:
        ch = KernelChoices(score_heads=layout)
        s_pal = jax.jit(lambda a, b: block_scores_pallas(a, b, cfg, bs, choices=ch))(q, kc)
        assert s_pal.shape == s_ref.shape
        assert _rel(s_pal, s_ref) <= 1e-6, layout
        i_pal = jax.jit(lambda a, b: select_blocks_pallas(a, b, cfg, bs, choices=ch))(q, kc)
        assert i_pal.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(i_pal), np.asarray(i_ref), err_msg=layout)
    np.testing.assert_array_equal(np.asarray(select_blocks(q, kc, cfg, impl="pallas")),
                                  np.asarray(i_ref))


def test_score_layout_auto_rule():
    """"auto" takes the loop layout where h is not a power of two and the h query tiles of the
    tile in use (score_q queries x Dk) fit 48 KB; explicit choices are kept."""
    from nsa_jax.pallas.scoring import score_layout
    auto = KernelChoices()
    assert score_layout(6, 64, 2, auto, 64) == "loop"            # 48 KB: fits
    assert score_layout(6, 64, 4, auto, 64) == "rows"            # float32: 96 KB
    assert score_layout(6, 64, 4, auto, 32) == "loop"            # float32, half the queries
    assert score_layout(3, 64, 2, auto, 256) == "rows"           # 96 KB at score_q 256
    assert score_layout(7, 64, 2, auto, 32) == "loop"
    assert score_layout(16, 64, 2, auto, 16) == "rows"           # a power of two: no padding
    assert score_layout(16, 64, 2, KernelChoices(score_heads="loop"), 64) == "loop"
    assert score_layout(6, 64, 2, KernelChoices(score_heads="rows"), 64) == "rows"


def test_block_scores_loop_default_tile_shorter_than_t():
    """The loop layout at the default 64-query tile with T = 40 < 64 (one partial tile) and
    h = 3, bf16 inputs against the rows layout and float32 against the reference."""
    cfg = dataclasses.replace(TINY, n_sel=6, n_init=2, n_local=3)
    args, _ = _inputs(43, 1, 40, 6, 2, cfg)
    q, kc = args[0], args[1]
    loop, rows = KernelChoices(score_heads="loop"), KernelChoices(score_heads="rows")
    got = jax.jit(lambda a, b: block_scores_pallas(a, b, cfg, choices=loop))(q, kc)
    assert _rel(got, ref.block_scores(ref.cmp_probs(q, kc, cfg), 40, cfg)) <= 1e-6
    qb, kb = q.astype(jnp.bfloat16), kc.astype(jnp.bfloat16)
    lb = jax.jit(lambda a, b: block_scores_pallas(a, b, cfg, choices=loop))(qb, kb)
    rb = jax.jit(lambda a, b: block_scores_pallas(a, b, cfg, choices=rows))(qb, kb)
    assert _rel(lb, rb) <= 1e-6


# the dQ chain's ends (pallas/nsa.py _nsa_bwd): selection alone, window -> compressed as the
# last kernel, compressed alone, window -> selection
@pytest.mark.parametrize("branches", [("slc",), ("cmp", "win"), ("cmp",), ("slc", "win")])
def test_parity_branch_subsets(branches):
    cfg = dataclasses.replace(TINY, branches=branches)
    args, cot = _inputs(3, 1, 50, 2, 1, cfg)
    _assert_parity(args, cot, cfg)


def test_parity_given_block_idx_with_unused_slots():
    """block_idx overrides the selection; -1 slots and blocks after the query are ignored."""
    T, G = 70, 2
    args, cot = _inputs(4, 1, T, 4, G, TINY)
    rng = np.random.default_rng(0)
    Ts = TINY.num_sel_blocks(T)
    idx = np.full((1, T, G, TINY.n_sel), -1, np.int32)
    for t in range(T):
        for g in range(G):
            k = rng.integers(1, TINY.n_sel + 1)
            idx[0, t, g, :k] = np.sort(rng.choice(Ts, size=k, replace=False))
    _assert_parity(args, cot, TINY, block_idx=jnp.asarray(idx))


def test_parity_sequence_shorter_than_a_compressed_block():
    args, cot = _inputs(5, 1, 6, 2, 1, TINY)  # T=6 < l=8: Tc=0
    assert args[1].shape[1] == 0
    _assert_parity(args, cot, TINY)


@pytest.mark.parametrize("packed", [False, True])
def test_parity_compressed_backward_with_its_own_tiles(packed):
    """The Pallas compressed backward in tiles of its own (``BlockSizes.cmp_bwd_rows``: 16 rows
    against the forward's and scoring's 32; packed rows derive their query tiles from it too):
    output and all 8 gradients against the reference."""
    bs = BlockSizes(cmp_bwd_keys=16, cmp_keys=16, cmp_rows=32, cmp_bwd_rows=16, score_sel=32,
                    sel_keys=16, sel_tile_q=16)
    ch = KernelChoices(cmp_attn="pallas", cmp_bwd_split=2)
    if not packed:
        args, cot = _inputs(16, 1, 75, 4, 2, TINY)
        _assert_parity(args, cot, TINY, block_sizes=bs, choices=ch)
        return
    from packed_util import cotangent, packed_inputs
    from test_packed import _pallas_vs_reference
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=12, n_sel=3, window=8)
    args, seg = packed_inputs(8, [[70, 3, 30, 17]], 2, 2, 8, 8, cfg)
    _pallas_vs_reference(args, seg, cfg, cotangent(9, args[0].shape), kernel="nsa_cmp_bwd_dq",
                         block_sizes=bs, choices=ch)


def test_parity_other_block_sizes():
    """Gather selection kernels with the atomic dK/dV, compressed dK/dV split over 3 query ranges
    (atomic adds, some ranges empty), smaller tiles and a wider scoring step."""
    args, cot = _inputs(6, 1, 75, 4, 2, TINY)
    bs = BlockSizes(cmp_bwd_keys=16, cmp_keys=16, cmp_rows=32, score_sel=32, sel_keys=16)
    ch = KernelChoices(sel_impl="gather", sel_bwd="atomic", cmp_bwd_split=3)
    _assert_parity(args, cot, TINY, block_sizes=bs, choices=ch)


@pytest.mark.parametrize("sel_bwd", ["inverted", "atomic"])
def test_parity_query_major_sub_tile_steps(sel_bwd):
    """The query-major selection kernels walk (block, sub-tile) steps: l' = 48 in three 16-key
    steps (``BlockSizes.sel_q_keys``), the causal cut inside a block's middle step, with both
    dK/dV strategies (the atomic one adds each step's tiles)."""
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=48, n_sel=3, window=16, n_init=1,
                    n_local=1)
    args, cot = _inputs(12, 1, 150, 4, 2, cfg)
    bs = BlockSizes(sel_q_keys=16)
    ch = KernelChoices(sel_impl="gather", sel_fwd="query", sel_dq="query", sel_bwd=sel_bwd)
    _assert_parity(args, cot, cfg, block_sizes=bs, choices=ch)


def test_parity_atomic_dkv_with_steps_wider_than_sel_keys():
    """The atomic dK/dV accumulators hold the per-query kernel's tiles when its steps
    (``sel_q_keys`` = 64) are wider than ``sel_keys`` (16) and l' = 40 is not a power of two:
    the last block's 64-key tile reaches past (Ts - 1) l' + 16 rows."""
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=40, n_sel=3, window=16, n_init=1,
                    n_local=1)
    args, cot = _inputs(13, 1, 150, 4, 2, cfg)
    ch = KernelChoices(sel_impl="gather", sel_fwd="query", sel_dq="query", sel_bwd="atomic")
    _assert_parity(args, cot, cfg, block_sizes=BlockSizes(sel_keys=16), choices=ch)


@pytest.mark.parametrize("sel_impl", ["auto", "gather"])
def test_parity_head_dims_not_powers_of_two(sel_impl):
    """Head dims padded to 32 / 64 inside the kernels, through the tiled selection kernels
    ("auto" at this T) and the per-query ones with the inverted dK/dV ("gather")."""
    args, cot = _inputs(7, 1, 45, 2, 1, TINY, Dk=24, Dv=40)
    _assert_parity(args, cot, TINY, choices=KernelChoices(sel_impl=sel_impl, sel_fwd="query",
                                                          sel_dq="query"))


def test_standalone_custom_vjps_and_lse_cotangent():
    """selection_attention and cmp_attention as ops of their own, including a cotangent on the
    returned base-2 log-sum-exp of the compressed branch."""
    T, Hq, G, D = 60, 4, 2, 16
    args, cot = _inputs(8, 1, T, Hq, G, TINY)
    q, kc, vc, ks, vs = args[:5]
    scale = 1 / math.sqrt(D)
    bs = BlockSizes()
    idx = ref.select_blocks(q, kc, TINY)
    w = jax.random.normal(jax.random.PRNGKey(9), (1, T, Hq))

    def sel_loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v) * cot)
    # jitted: one compile per gradient instead of op-by-op dispatch (test speed only)
    gp = jax.jit(jax.grad(sel_loss(lambda q, k, v: selection_attention(
        q, k, v, idx, TINY, bs, scale, True)), (0, 1, 2)))(q, ks, vs)
    gr = jax.jit(jax.grad(sel_loss(lambda q, k, v: ref.selection_attention(q, k, v, idx, TINY)),
                          (0, 1, 2)))(q, ks, vs)
    for a, b in zip(gp, gr):
        assert _rel(a, b) <= TOL

    def ref_cmp(q, kc, vc):
        Tc = kc.shape[1]
        s = jnp.einsum("btghd,bigd->btghi", q.reshape(1, T, G, Hq // G, D), kc) * scale
        vis = jnp.asarray(ref.cmp_visible(T, Tc, TINY))[None, :, None, None, :]
        lse = jax.nn.logsumexp(jnp.where(vis, s, -jnp.inf), axis=-1).reshape(1, T, Hq)
        return ref.compressed_attention(q, kc, vc, TINY), lse / LN2

    def cmp_loss(f):
        def loss(q, kc, vc):
            o, lse = f(q, kc, vc)
            ok = jnp.isfinite(lse)  # no visible block yet: lse = +inf, no gradient
            return jnp.sum(o * cot) + jnp.sum(jnp.where(ok, lse, 0.0) * w)
        return loss
    gp = jax.jit(jax.grad(cmp_loss(lambda q, kc, vc: cmp_attention(q, kc, vc, TINY, bs, scale,
                                                                   True)), (0, 1, 2)))(q, kc, vc)
    gr = jax.jit(jax.grad(cmp_loss(ref_cmp), (0, 1, 2)))(q, kc, vc)
    for a, b in zip(gp, gr):
        assert _rel(a, b) <= TOL


def test_count_below_is_searchsorted():
    """The index's counts on sorted rows (run starts + reverse running minimum) equal
    searchsorted: side "left" for the bounds 0..nv (values >= nv, the unused slot, counted by
    none), "right" from entry 1 on."""
    from nsa_jax.pallas.selection import _count_below
    rng = np.random.default_rng(5)
    nv = 9
    rows = np.sort(rng.integers(0, nv + 1, size=(4, 50)), axis=-1).astype(np.int32)
    rows[0] = nv                         # a row of unused slots only
    rows[1, :20] = 0                     # a run at the first bound
    rows[2, 40:] = nv + 3                # values past nv count as nv: below no bound
    rows[2] = np.sort(rows[2])
    got = np.asarray(jax.jit(lambda r: _count_below(r, nv))(jnp.asarray(rows)))
    for r, g in zip(rows, got):
        r = np.minimum(r, nv)
        np.testing.assert_array_equal(g, np.searchsorted(r, np.arange(nv + 1), side="left"))
        np.testing.assert_array_equal(g[1:], np.searchsorted(r, np.arange(nv), side="right"))


@pytest.mark.parametrize("sort", ["flat16", "flat32", "rows"])
def test_inverted_index_covers_every_selection_once(monkeypatch, sort):
    """Every sort: one flat stable sort of (row, range) keys carrying the entry, 16-bit or 32-bit
    keys, and the per-row two-key sort where the flat keys would not fit; an item's base is its
    block's first key, and each item lists its queries in ascending order. A block starting past
    the query (no key of it visible) is left out."""
    import nsa_jax.pallas.selection as sel
    if sort == "flat32":
        monkeypatch.setattr(sel, "SHORT_KEY_MAX", 0)
    if sort == "rows":
        monkeypatch.setattr(sel, "ONE_KEY_MAX", 0)
    rng = np.random.default_rng(1)
    B, T, G, n, Ts, chunk, l_sel = 2, 40, 3, 4, 5, 7, 8
    idx = rng.integers(-1, Ts, size=(B, T, G, n)).astype(np.int32)
    meta, qt = jax.jit(lambda i: inverted_index(i, T, Ts, chunk, l_sel))(jnp.asarray(idx))
    meta, qt = np.asarray(meta), np.asarray(qt)
    got = []
    for b, g, base, start, count in meta:
        assert 0 <= count <= chunk
        ts = qt[b, g, start:start + count]
        assert (np.diff(ts) >= 0).all(), ts      # a stable sort keeps entry order in a block
        got += [(b, g, base, t) for t in ts]
    want = [(b, g, idx[b, t, g, s] * l_sel, t) for b in range(B) for t in range(T)
            for g in range(G) for s in range(n) if 0 <= idx[b, t, g, s] * l_sel <= t]
    assert len(want) < (idx >= 0).sum()      # some selected blocks start past their query
    assert sorted(got) == sorted(want)


def test_packed_inverted_index_lists_each_pair_once_under_a_range_holding_its_keys(monkeypatch):
    """Packed rows, slot payloads (the block-major forward's index): the flat and the
    two-key sorts give the same index; every (query, slot) is listed once, under an l'-key
    range [base, base + l') that holds every key the query sees of its block, whose ranges are
    aligned blocks or start at a block's first key (at most 2 Ts - 1 distinct ranges), and all
    the entries of one range that is not aligned share its first key."""
    import nsa_jax.pallas.selection as sel
    rng = np.random.default_rng(2)
    B, T, G, n, l_sel, chunk = 2, 45, 2, 3, 8, 5
    start = np.zeros((B, T), np.int32)
    start[:, 13:] = 13
    start[1, 30:] = 30
    start[1, 31:] = 31   # a document of one token
    Ts = -(-T // l_sel)
    idx = np.full((B, T, G, n), -1, np.int32)
    for b in range(B):
        for t in range(T):
            for g in range(G):
                k = rng.integers(1, n + 1)
                m = (t - start[b, t]) // l_sel + 1     # candidate document blocks
                idx[b, t, g, :min(k, m)] = np.sort(rng.choice(m, size=min(k, m), replace=False))
    f = jax.jit(lambda i, s: inverted_index(i, T, Ts, chunk, l_sel, s, slots=True))
    one = [np.asarray(x) for x in f(jnp.asarray(idx), jnp.asarray(start))]
    monkeypatch.setattr(sel, "ONE_KEY_MAX", 0)
    f2 = jax.jit(lambda i, s: inverted_index(i, T, Ts, chunk, l_sel, s, slots=True))
    two = [np.asarray(x) for x in f2(jnp.asarray(idx), jnp.asarray(start))]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    meta, qt, pt = one
    got, ranges = [], set()
    for b, g, base, s0, c in meta:
        for e, p in zip(qt[b, g, s0:s0 + c], pt[b, g, s0:s0 + c]):
            t, s = e // n, e % n
            assert p == start[b, t] + idx[b, t, g, s] * l_sel
            # the range holds every key the query sees of its block [p, min(p + l', t + 1))
            assert base <= p and min(p + l_sel, t + 1) <= base + l_sel
            assert base % l_sel == 0 or base == p
            got.append((b, g, t, s))
        if c:
            ranges.add((b, g, base))
    want = [(b, g, t, s) for b in range(B) for t in range(T) for g in range(G)
            for s in range(n) if idx[b, t, g, s] >= 0]
    assert sorted(got) == sorted(want)
    for b in range(B):
        for g in range(G):
            assert len({r for r in ranges if r[:2] == (b, g)}) <= 2 * Ts - 1


@pytest.mark.parametrize("h", [1, 2, 4, 6, 8, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_defaults_never_split_a_64_row_tile_across_warpgroups(h, head_dim):
    """``BlockSizes.for_shape``'s bf16 launches give every tensor-core tile kernel at most 4 warps
    per 64 tile rows. A wgmma is one warpgroup (4 warps) over 64 rows, so 8 warps on a 64-row tile
    split its N columns between two warpgroups (64x32 / 64x64 wgmmas instead of 64x64 / 64x128):
    the tiled, local and block-major kernels ran 20-59% slower that way at 128-wide heads on an
    H100 (bench/NOTES.md, thirtieth session)."""
    bs = BlockSizes.for_shape(h, head_dim, 2)
    hp = 1 << (h - 1).bit_length()
    w = lambda own: own or bs.num_warps
    launches = {   # kernel: (tile rows, warps)
        "cmp_fwd": (max(bs.cmp_rows, hp), w(bs.cmp_warps)),
        "cmp_bwd": (max(bs.cmp_bwd_rows or bs.cmp_rows, hp), w(bs.cmp_bwd_warps)),
        "sel_bwd_dkv (inverted)": (max(bs.sel_rows, hp), w(bs.sel_bwd_warps)),
        "sel_fwd_block": (max(bs.sel_rows, hp), bs.num_warps),
        "sel_bwd_block": (max(bs.sel_dq_rows, hp), bs.num_warps),
        "sel_tiled_*": (bs.sel_tile_q, bs.num_warps),
        "local_*": (bs.win_q, bs.num_warps),
    }
    over = {k: v for k, v in launches.items() if v[1] > 4 * max(1, v[0] // 64)}
    assert not over, over


def test_compressed_forward_takes_cmp_warps():
    """The compressed forward launches with ``cmp_warps`` (None: ``num_warps``): 8 at bf16 128-wide
    heads, two warpgroups for its 128-row tiles (4 measured 11-40% slower there on an H100;
    bench/NOTES.md, thirtieth session), while the compressed backward there takes 4."""
    from nsa_jax.pallas.compressed import cmp_backward, cmp_forward
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)
    q = jnp.zeros((1, 64, 4, 128), jnp.bfloat16)
    kc = jnp.zeros((1, cfg.num_cmp_blocks(64), 1, 128), jnp.bfloat16)

    def launches(bs):
        def f(q, kc, vc):
            o, lse = cmp_forward(q, kc, vc, cfg, bs, 0.1, True)
            return cmp_backward(q, kc, vc, o, lse, q, None, None, cfg, bs, 0.1, True)
        out = kernel_warps(f, q, kc, kc)
        return out["nsa_cmp_fwd"], out["nsa_cmp_bwd_dq"]
    wide = BlockSizes.for_shape(4, 128)
    assert launches(wide) == (8, 4)
    assert launches(dataclasses.replace(wide, cmp_warps=None)) == (4, 4)
    assert launches(BlockSizes(num_warps=2)) == (2, 2)


@pytest.mark.parametrize("field,value", [("cmp_rows", 48), ("sel_keys", 8), ("num_warps", 3),
                                         ("score_q", 8), ("score_q", 48), ("cmp_bwd_rows", 48),
                                         ("cmp_bwd_rows", 8), ("cmp_bwd_warps", 3),
                                         ("sel_bwd_warps", 3), ("cmp_warps", 3),
                                         ("topn_tour_rows", 0),
                                         ("topn_tour_rows", 3), ("topn_tour_rows", 128)])
def test_block_sizes_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=f"BlockSizes.{field}"):
        BlockSizes(**{field: value})


@pytest.mark.parametrize("field,value", [("sel_bwd", "x"), ("score_dot", "bf16"),
                                         ("sel_impl", "dense"), ("sel_tiled_max_t", -1),
                                         ("cmp_pallas_max_t", -1), ("cmp_pallas_max_t", True),
                                         ("win_attn", "x"),
                                         ("cmp_bwd_split", 0), ("sel_fwd", "x"),
                                         ("sel_dq", "x"), ("sel_partial_mib", 0),
                                         ("sel_partial_mib", "512"), ("sel_partial_mib", True),
                                         ("score_heads", "heads")])
def test_kernel_choices_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=f"kernel.{field}"):
        KernelChoices(**{field: value})


def test_kernel_choices_reject_block_dq_with_atomic_backward():
    with pytest.raises(ValueError, match="kernel.sel_dq: 'block' .* needs kernel.sel_bwd"):
        KernelChoices(sel_dq="block", sel_bwd="atomic")


def test_sel_partial_mib_reaches_the_kernels_from_a_config(tmp_path):
    """exec.kernel.sel_partial_mib from YAML / overrides (an int is taken as MiB)."""
    from nsa_jax.config import load_config
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "tiny.yaml", ["exec.kernel.sel_partial_mib=64"])
    assert cfg.exec.kernel.sel_partial_mib == 64


def test_f32_dot_choice_sets_every_float32_matmul_precision():
    """KernelChoices.f32_dot, not jax_default_matmul_precision, sets the float32 dots: the Pallas
    dots on the GPU (Triton input_precision ieee / tf32; the float32 window branch is one of
    them) and the window branch's XLA einsums (its CPU path); bf16 operands and the CPU
    interpreter's Pallas dots are unaffected."""
    from jax import lax

    from nsa_jax.pallas.common import dot_precision
    from nsa_jax.pallas.window import window_attention
    tf32 = KernelChoices(f32_dot="tf32")
    assert dot_precision(jnp.float32, False) == lax.Precision.HIGHEST
    assert dot_precision(jnp.float32, False, tf32) == lax.Precision.DEFAULT
    assert dot_precision(jnp.bfloat16, False) is None
    assert dot_precision(jnp.float32, True) is None
    q = jnp.ones((1, 8, 2, 16), jnp.float32)
    k = jnp.ones((1, 8, 1, 16), jnp.float32)
    for ch, want in ((None, lax.Precision.HIGHEST), (tf32, lax.Precision.DEFAULT)):
        with jax.default_matmul_precision("bfloat16"):
            jaxpr = jax.make_jaxpr(lambda q, k: window_attention(q, k, k, TINY, True,
                                                                 choices=ch))(q, k).jaxpr
        precs = [e.params["precision"] for e in jaxpr.eqns if e.primitive.name == "dot_general"]
        assert precs == [(want, want)] * 2, precs
    with pytest.raises(ValueError, match="kernel.f32_dot"):
        KernelChoices(f32_dot="bf16")


WIDE = dataclasses.replace(TINY, n_sel=16, n_init=1, n_local=2)


def test_topn_tournament_rule():
    """Which buckets take the tournament kernel: unpacked, 512..2048 columns, rows whose forced
    blocks are distinct candidates, n_sel picks within the row."""
    from nsa_jax.pallas.topn import _tournament
    cfg = NSAConfig()                                   # l' = 64, n = 16, 1 + 2 forced
    assert _tournament(1024, 512 * 64, 1024, cfg, False)
    assert _tournament(2048, 1024 * 64, 2048, cfg, False)
    assert not _tournament(256, 128 * 64, 1024, cfg, False)      # narrow: rounds kernel
    assert not _tournament(4096, 2048 * 64, 4096, cfg, False)    # unrolled first pass too long
    assert not _tournament(1024, 512 * 64, 1024, cfg, True)      # packed rows
    assert not _tournament(1024, 2 * 64, 1024, cfg, False)       # cur < n_init + n_local
    assert not _tournament(1024, 512 * 64, 8, cfg, False)        # fewer blocks than n_sel


TOUR_KINDS = ("one_value", "two_values", "top_in_one_segment", "few_finite", "segment_edges")


def _tour_scores(kind, rng, shape):
    """Scores [T, G, Ts] of one tournament case (``test_topn_tournament_equals_semantics``)."""
    if kind == "one_value":
        return np.ones(shape)
    if kind == "two_values":
        return rng.integers(0, 2, shape).astype(float)
    if kind == "top_in_one_segment":
        s = rng.random(shape) * 0.5
        s[..., 64:96] += 1.0
        return s
    if kind == "few_finite":
        return np.where(rng.random(shape) < 0.03, rng.random(shape), -np.inf)
    s = rng.random(shape) * 0.5                                  # segment_edges
    s[..., [31, 32, 63, 64, 200]] = 2.0
    return s


@pytest.mark.parametrize("bs", [None, BlockSizes(topn_tour_rows=None),
                                BlockSizes(topn_tour_rows=8)], ids=["rows1", "rows_elems", "rows8"])
def test_topn_tournament_equals_semantics(bs, monkeypatch):
    """The tournament kernel of the wide unpacked buckets (``topn._tour_kernel``; T = 4200 at
    l' = 16 with the kernel's threshold lowered to 256 columns: buckets of 256 and 512 columns,
    1 row per program (the default), 8, or ``topn_elems`` // width (None: 4 and 2)) ==
    ``lax.top_k``'s rule on rows built against it, one batch row per kind (one compile per
    launch setting): every candidate equal (picks by index alone), two values, all high scores
    in one 32-column segment (one segment is reloaded every round), fewer finite candidates
    than picks (-inf scores are never selected: slots -1), and ties that straddle segment edges
    (columns 31/32, 63/64 equal to the row maximum)."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas import topn
    from nsa_jax.pallas.topn import topn_pallas
    monkeypatch.setattr(topn, "TOUR_MIN_WIDTH", 256)
    T, G, cfg = 4200, 2, WIDE
    Ts = cfg.num_sel_blocks(T)
    rng = np.random.default_rng(7)
    s = np.stack([_tour_scores(kind, rng, (T, G, Ts)) for kind in TOUR_KINDS])
    scores = jnp.asarray(s.astype(np.float32))
    want = np.asarray(semantics.topn_from_scores(scores, jnp.arange(T)[None, :, None], cfg))
    got = np.asarray(jax.jit(lambda x: topn_pallas(x, cfg, True, None, bs))(scores))
    bad = [kind for i, kind in enumerate(TOUR_KINDS) if not np.array_equal(got[i], want[i])]
    assert not bad, f"tournament top-n differs from lax.top_k's rule for: {bad}"


@pytest.mark.parametrize("start", [16, 48, 4800])
def test_topn_full_width_at_positions_past_the_rows(start):
    """``topn_pallas(full_width=True)`` (a continuation chunk's top-n: 40 query rows at
    positions start + i over 600 blocks, one 1,024-column bucket on the rounds kernel) ==
    ``lax.top_k``'s rule on the tournament cases, one batch row per kind, with the forced
    blocks overlapping (start 16) or not."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_pallas
    cfg = dataclasses.replace(TINY, n_sel=6, n_init=1, n_local=2)
    T, G, Ts = 40, 2, 600
    rng = np.random.default_rng(start)
    scores = jnp.asarray(np.stack([_tour_scores(kind, rng, (T, G, Ts))
                                   for kind in TOUR_KINDS]).astype(np.float32))
    rel = jnp.broadcast_to(start + jnp.arange(T, dtype=jnp.int32), (len(TOUR_KINDS), T))
    want = np.asarray(semantics.topn_from_scores(scores, rel[:, :, None], cfg))
    got = np.asarray(jax.jit(lambda x, r: topn_pallas(x, cfg, True, r, full_width=True))(
        scores, rel))
    bad = [kind for i, kind in enumerate(TOUR_KINDS) if not np.array_equal(got[i], want[i])]
    assert not bad, f"full-width top-n differs from lax.top_k's rule for: {bad}"


@pytest.mark.parametrize("start,n_init,n_local,bs", [
    (16, 1, 2, None),                            # rows with 1..3 candidates: all of them taken
    (0, 3, 1, None),                             # rows with fewer candidates than initial blocks
    (48, 2, 3, BlockSizes(topn_tour_rows=8)),    # forced blocks overlapping, 8 rows a program
    (4800, 1, 2, None),                          # 300+ candidates of 600 columns
    (9550, 0, 1, BlockSizes(topn_tour_rows=None)),   # past every column; no initial block
])
def test_topn_upto_equals_semantics_without_a_switch(start, n_init, n_local, bs):
    """``topn.topn_upto`` (a continuation chunk's top-n: 40 query rows at positions start + i,
    ``start`` traced, over 600 blocks) takes the tournament kernel with its first pass bounded
    on the device: == ``lax.top_k``'s rule on the tournament cases (one batch row per kind),
    and its jaxpr holds no ``cond`` (no host round trip on a GPU)."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_upto
    cfg = dataclasses.replace(TINY, n_sel=6, n_init=n_init, n_local=n_local)
    T, G, Ts = 40, 2, 600
    rng = np.random.default_rng(start)
    scores = jnp.asarray(np.stack([_tour_scores(kind, rng, (T, G, Ts))
                                   for kind in TOUR_KINDS]).astype(np.float32))

    def f(x, s0):
        rel = jnp.broadcast_to(s0 + jnp.arange(T, dtype=jnp.int32), (len(TOUR_KINDS), T))
        return topn_upto(x, cfg, True, rel, s0 + (T - 1), T - 1, bs)

    s0 = jnp.int32(start)
    prims = {e.primitive.name for e in jax.make_jaxpr(f)(scores, s0).jaxpr.eqns}
    assert "cond" not in prims and "pallas_call" in prims, prims
    rel = jnp.broadcast_to(start + jnp.arange(T, dtype=jnp.int32), (len(TOUR_KINDS), T))
    want = np.asarray(semantics.topn_from_scores(scores, rel[:, :, None], cfg))
    got = np.asarray(jax.jit(f)(scores, s0))
    bad = [kind for i, kind in enumerate(TOUR_KINDS) if not np.array_equal(got[i], want[i])]
    assert not bad, f"topn_upto differs from lax.top_k's rule for: {bad}"


@pytest.mark.parametrize("T,cfg,packed,bs,distinct", [
    (700, TINY, False, None, False),       # Ts = 44 -> width buckets 16, 32, 64; B = 2 rows
    (700, TINY, True, None, False),        # packed: the same buckets, document-relative t
    (300, dataclasses.replace(TINY, n_sel=6, n_init=2, n_local=3), False,
     BlockSizes(topn_elems=256, topn_warps=2), False),   # several rows per program
    (40, dataclasses.replace(TINY, n_sel=6, n_init=2, n_local=3), False, None, False),  # k=3 < 5
    (4200, WIDE, False, None, False),   # Ts = 263: every bucket width up to 512 columns
    (4200, WIDE, False, None, True),    # the same, distinct scores (no ties)
])
def test_topn_kernel_equals_semantics_with_ties(T, cfg, packed, bs, distinct):
    """``topn_pallas`` (forced blocks marked up front, width buckets) == ``lax.top_k`` rule:
    scores drawn from 4 values, so most rows hold ties (lower index wins), or ``distinct``
    ones."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_pallas
    B, G = 2, 2
    Ts = cfg.num_sel_blocks(T)
    rng = np.random.default_rng(T)
    scores = rng.random((B, T, G, Ts)) if distinct else rng.integers(0, 4, (B, T, G, Ts)) / 4
    scores = jnp.asarray(scores.astype(np.float32))
    if packed:
        starts = np.sort(rng.choice(np.arange(1, T), 5, replace=False))
        rel = np.stack([np.arange(T) - np.concatenate([[0], starts])[
            np.searchsorted(starts, np.arange(T), side="right")] for _ in range(B)])
        rel = jnp.asarray(rel, jnp.int32)
        want = semantics.topn_from_scores(scores, rel[:, :, None], cfg)
    else:
        rel = None
        want = semantics.topn_from_scores(scores, jnp.arange(T)[None, :, None], cfg)
    got = jax.jit(lambda s, r: topn_pallas(s, cfg, True, r, bs))(scores, rel)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("n_init,n_local", [(0, 0), (0, 1)])
def test_topn_kernel_never_selects_minus_inf_without_init_block(n_init, n_local):
    """Rows with fewer finite candidates than picks and no forced block 0: the rounds kernel's
    picks at -inf (the row exhausted) must select nothing, so a -inf candidate (e.g. column 0)
    stays unselected and its slot -1, as ``lax.top_k``'s rule (n_init = 1 hides this: an
    exhausted round lands on the already chosen block 0)."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_pallas
    cfg = dataclasses.replace(TINY, n_sel=4, n_init=n_init, n_local=n_local)
    B, T, G = 1, 200, 2
    Ts = cfg.num_sel_blocks(T)
    rng = np.random.default_rng(11)
    s = np.where(rng.random((B, T, G, Ts)) < 0.6, -np.inf, rng.random((B, T, G, Ts)))
    scores = jnp.asarray(s.astype(np.float32))
    want = semantics.topn_from_scores(scores, jnp.arange(T)[None, :, None], cfg)
    assert (np.asarray(want) == -1).any()
    got = jax.jit(lambda x: topn_pallas(x, cfg, True))(scores)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_topn_kernel_writes_stay_inside_each_row(monkeypatch):
    """Every enabled store of the top-n kernels indexes inside ids [N, n_sel]: interpret mode
    drops an out-of-range scatter silently, while a GPU writes it into the next row (e.g. the
    -1 padding over next_pow2(n_sel) slots at n_sel = 6). Indices are clamped here, so an
    enabled out-of-range store lands on a real slot and shows in the ids."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas import topn
    from nsa_jax.pallas.topn import topn_pallas
    orig = topn.store

    def clamped_store(view, val, mask):
        idx = tuple(jnp.clip(i, 0, n - 1) if isinstance(i, jax.Array) else i
                    for i, n in zip(view.transforms[-1].indices, view.ref.shape))
        orig(view.ref.at[idx], val, mask)

    monkeypatch.setattr(topn, "store", clamped_store)
    cfg = dataclasses.replace(TINY, n_sel=6, n_init=1, n_local=1)
    B, T, G = 1, 300, 2
    Ts = cfg.num_sel_blocks(T)
    scores = jnp.asarray(np.random.default_rng(5).random((B, T, G, Ts)).astype(np.float32))
    want = semantics.topn_from_scores(scores, jnp.arange(T)[None, :, None], cfg)
    got = jax.jit(lambda x: topn_pallas(x, cfg, True))(scores)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
