"""Block-major selection kernels (``nsa_jax/pallas/selection_block.py``) in interpret mode: the
forward (``KernelChoices.sel_fwd="block"``): o and lse equal the query-major kernel's (float32,
<= 2e-5), with unused slots and blocks past the query, work items split into several chunks and
query tiles; bf16 partials; the fused dK/dV + dQ backward (``sel_dq="block"``): dq, dk, dv equal
the query-major dQ + inverted dK/dV kernels' (own index and the forward's); and the whole op with
both matches the reference (values and all 8 gradients), unpacked and packed."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.common import POS_INF
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.selection_block import sel_backward_block, sel_forward_block
from nsa_testutil import assert_launch_follows_num_warps, kernel_warps
from packed_util import packed_inputs
from test_pallas import TINY, _assert_parity, _inputs, _rel

# 16-row tiles and 5-query chunks: several tiles per item and several items per block
SMALL = BlockSizes(sel_rows=16, sel_chunk=5, sel_keys=16, sel_dq_rows=16)
# partial buffers bounded far below these tests' sizes (15000 bytes): the slots run in 3-4 passes
PASSES = KernelChoices(sel_partial_mib=15000 / 2**20)


def _random_idx(seed, B, T, G, cfg):
    """Distinct block ids per (b, t, g) with -1 slots, some blocks past the query."""
    rng = np.random.default_rng(seed)
    Ts = cfg.num_sel_blocks(T)
    idx = np.full((B, T, G, cfg.n_sel), -1, np.int32)
    for b in range(B):
        for t in range(T):
            for g in range(G):
                k = rng.integers(1, min(cfg.n_sel, Ts) + 1)
                idx[b, t, g, :k] = np.sort(rng.choice(Ts, size=k, replace=False))
    return jnp.asarray(idx)


def _check(q, k, v, idx, cfg, bs, ch=None):
    # jitted (as inside the op): one compile per kernel pair, not op-by-op glue (test speed)
    o, lse = jax.jit(lambda *a: sel_forward_block(*a, cfg, bs, 0.3, True, choices=ch))(
        q, k, v, idx)
    o_w, lse_w = jax.jit(lambda *a: sel_forward(*a, cfg, bs, 0.3, True))(q, k, v, idx)
    assert _rel(o, o_w) <= 2e-5
    lse, lse_w = np.asarray(lse), np.asarray(lse_w)
    np.testing.assert_array_equal(lse == POS_INF, lse_w == POS_INF)
    fin = lse_w != POS_INF
    assert fin.any()
    np.testing.assert_allclose(lse[fin], lse_w[fin], rtol=0, atol=2e-5)


@pytest.mark.parametrize("h,G,bs,ch", [(6, 1, SMALL, None), (1, 2, BlockSizes(), None),
                                       (6, 1, SMALL, PASSES)])
def test_block_forward_equals_query_forward(h, G, bs, ch):
    T = 53                                               # not a multiple of l' = 16
    args, _ = _inputs(20 + h, 2, T, h * G, G, TINY)
    idx = _random_idx(h, 2, T, G, TINY)
    _check(args[0], args[3], args[4], idx, TINY, bs, ch)


def backward_case(seed: int, h: int, G: int, cfg, bs, T: int = 53):
    """A selection backward's inputs at B = 2, odd T: (q, k, v, idx, o, lse, do, gs), with o and
    lse from the per-query forward (jitted, as inside the op: one compile per kernel set, not
    op-by-op glue) and a per-row scale gs."""
    args, _ = _inputs(50 + seed, 2, T, h * G, G, cfg)
    idx = _random_idx(7 + seed, 2, T, G, cfg)
    q, k, v = args[0], args[3], args[4]
    o, lse = jax.jit(lambda *a: sel_forward(*a, cfg, bs, 0.3, True))(q, k, v, idx)
    do = jax.random.normal(jax.random.PRNGKey(h), o.shape)
    gs = jax.random.uniform(jax.random.PRNGKey(h + 1), o.shape[:3], minval=0.2)
    return q, k, v, idx, o, lse, do, gs


@pytest.mark.parametrize("h,G,cfg,bs,ch", [
    (6, 1, TINY, SMALL, None),
    (2, 2, TINY, dataclasses.replace(SMALL, sel_dq_rows=32), None),  # dQ tiles > items' tiles
    # two key sub-tiles per block (l' = 32, 16-key tiles) and dQ tiles < the items' tiles
    (2, 1, dataclasses.replace(TINY, sel_block=32), dataclasses.replace(SMALL, sel_rows=32),
     None),
    (6, 1, TINY, SMALL, PASSES)])                                      # slots in 4 passes
def test_fused_backward_equals_query_backward(h, G, cfg, bs, ch):
    """dQ as per-slot partials of the dK/dV kernel == the per-query dQ kernel; dK/dV unchanged;
    with its own index and with the block forward's (slot payloads; items cut for sel_rows
    tiles, walked in sel_dq_rows tiles)."""
    q, k, v, idx, o, lse, do, gs = backward_case(h, h, G, cfg, bs)
    want = jax.jit(lambda *a: sel_backward(*a, cfg, bs, 0.3, True))(q, k, v, idx, o, lse, do,
                                                                     gs)
    index = jax.jit(lambda *a: sel_forward_block(*a, cfg, bs, 0.3, True, return_index=True,
                                                 choices=ch)[2])(q, k, v, idx)
    assert (len(index) > 1) == (ch is not None)
    for ix in (None, index):
        got = jax.jit(lambda *a, ix: sel_backward_block(*a, cfg, bs, 0.3, True, index=ix,
                                                        choices=ch))(q, k, v, idx, o, lse, do,
                                                                     gs, ix=ix)
        assert float(jnp.abs(got[0]).max()) > 0
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            assert _rel(a, b) <= 2e-5


@pytest.mark.parametrize("block", [True, False])
def test_gate_folded_into_lse_equals_gated_cotangent(block):
    """The gate folded into the saved lse (``common.fold_gate``, P' = gs P) == the same backward
    with the gate moved into the cotangent (gs * dO, no gate): dq, dk, dv to 2e-5, with gates of
    exactly 0 on some rows (lse' = +inf there, P' = 0) and gates of 1; through the fused
    block-major backward and the per-query dQ + inverted dK/dV kernels."""
    q, k, v, idx, o, lse, do, gs = backward_case(3, 6, 1, TINY, SMALL)
    rows = np.arange(gs.shape[1])
    gs = jnp.where((rows % 7 == 1)[None, :, None], 1.0, gs)
    gs = jnp.where((rows % 5 == 0)[None, :, None], 0.0, gs)
    bwd = sel_backward_block if block else sel_backward
    run = jax.jit(lambda *a: bwd(*a, TINY, SMALL, 0.3, True))
    got = run(q, k, v, idx, o, lse, do, gs)
    want = run(q, k, v, idx, o, lse, gs[..., None] * do, None)
    assert float(jnp.abs(got[0]).max()) > 0
    for a, b in zip(got, want):
        assert bool(jnp.all(jnp.isfinite(a)))
        assert _rel(a, b) <= 2e-5
    assert float(jnp.abs(got[0][:, rows % 5 == 0]).max()) == 0.0   # a zero gate: no dQ


# (slot passes with the fused backward: the packed op test below and the kernel tests above)
@pytest.mark.parametrize("mib,sel_dq", [(1024.0, "block"), (15000 / 2**20, "query")])
def test_op_with_block_kernels_matches_reference(mib, sel_dq):
    """Block forward and fused backward: the forward's index is the one the backward walks
    (B = 2: the packed test below); with slots in 3 passes (the query dQ's inverted dK/dV then
    builds its own index)."""
    args, cot = _inputs(31, 1, 75, 4, 2, TINY)
    _assert_parity(args, cot, TINY, block_sizes=SMALL,
                   choices=KernelChoices(sel_impl="gather", sel_fwd="block", sel_dq=sel_dq,
                                         sel_partial_mib=mib))


@pytest.mark.parametrize("sel_dq", ["block", "query"])
def test_op_with_block_kernels_where_a_key_tile_reaches_past_the_block(sel_dq):
    """l' = 24 in 16-key sub-tiles: the second sub-tile holds 8 keys of the next block, which
    only the kernels' column mask (``selection.block_kv``'s kcol) hides; through the block
    forward and each backward that walks the items (fused, and the inverted dK/dV)."""
    cfg = dataclasses.replace(TINY, sel_block=24)
    args, cot = _inputs(33, 1, 75, 4, 2, cfg)
    _assert_parity(args, cot, cfg, block_sizes=SMALL,
                   choices=KernelChoices(sel_impl="gather", sel_fwd="block", sel_dq=sel_dq))


@pytest.mark.parametrize("sel_dq", ["block", "query"])
def test_op_with_repeated_block_ids_matches_reference(sel_dq):
    """A caller's block_idx with a block id repeated in a row (and a block past the query)
    selects the union of its blocks, as the reference's mask does: the Pallas op drops the
    repeats (``semantics.distinct_ids``) before its kernels, which take one partial per slot;
    through the block-major forward's two launches (a repeated diagonal block would otherwise
    push entries past the "diag" prefix it counts) and both backwards."""
    B, T, G = 1, 75, 2
    args, cot = _inputs(35, B, T, 4, G, TINY)
    rng = np.random.default_rng(3)
    Ts = TINY.num_sel_blocks(T)
    idx = np.full((B, T, G, TINY.n_sel), -1, np.int32)
    for t in range(T):
        for g in range(G):
            own = t // TINY.sel_block
            idx[0, t, g] = [own, own, rng.integers(0, Ts), rng.integers(0, Ts)]
    assert (idx[..., 0] == idx[..., 1]).all()
    _assert_parity(args, cot, TINY, block_sizes=SMALL, block_idx=jnp.asarray(idx),
                   choices=KernelChoices(sel_impl="gather", sel_fwd="block", sel_dq=sel_dq))


def test_distinct_ids_drops_later_repeats_only():
    from nsa_jax.nsa.semantics import distinct_ids
    idx = jnp.asarray([[3, 3, -1, 5, 3, 5, 0, -1]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(distinct_ids(idx)), [[3, -1, -1, 5, -1, -1, 0, -1]])


def test_slot_passes_bound_the_partial_buffer():
    from nsa_jax.pallas.selection_block import slot_passes
    # 125M shape at 64k, bf16: 1.5 GiB of partials -> 2 passes of <= 1024 MiB (the default)
    assert slot_passes((1, 65536, 2, 16), 12, 64, jnp.bfloat16) == [(0, 8), (8, 16)]
    assert slot_passes((1, 65536, 2, 16), 12, 64, jnp.bfloat16,
                       KernelChoices(sel_partial_mib=512)) == [(0, 5), (5, 11), (11, 16)]
    assert slot_passes((4, 8192, 2, 16), 12, 64, jnp.bfloat16) == [(0, 16)]
    # never more passes than slots
    assert len(slot_passes((1, 65536, 2, 16), 12, 64, jnp.float32,
                           KernelChoices(sel_partial_mib=1e-6))) == 16


@pytest.mark.parametrize("mib", [1024.0, 15000 / 2**20])
def test_packed_op_with_block_kernels_matches_reference(mib):
    """Packed rows through the op with the block-major forward and fused backward (documents of
    length 1 and < l', starts off the l' grid: blocks that cross an aligned boundary are listed
    under their own key range); its index (slot payloads) is the one the backward walks."""
    from test_packed import CFG as PCFG
    from test_packed import LENGTHS, _pallas_vs_reference
    from packed_util import cotangent
    args, seg = packed_inputs(12, LENGTHS, 4, 2, 8, 8, PCFG)
    _pallas_vs_reference(args, seg, PCFG, cotangent(13, args[0].shape),
                         kernel="nsa_sel_bwd_block", block_sizes=SMALL,
                         choices=KernelChoices(sel_impl="gather", sel_fwd="block",
                                               sel_dq="block", sel_partial_mib=mib))


def test_block_forward_bf16_partials():
    """bf16 inputs: the partial outputs are stored in bf16 and merged in float32; o stays within
    bf16 rounding of the float32 query-major result on the same (rounded) inputs (1.8e-3 here;
    the bf16 query-major kernel: 0.8e-3), lse (float32 logits either way) to float32 rounding."""
    args, _ = _inputs(41, 2, 53, 6, 1, TINY)
    idx = _random_idx(5, 2, 53, 1, TINY)
    q, k, v = (a.astype(jnp.bfloat16) for a in (args[0], args[3], args[4]))
    o, lse = jax.jit(lambda *a: sel_forward_block(*a, TINY, SMALL, 0.3, True))(q, k, v, idx)
    o_w, lse_w = jax.jit(lambda *a: sel_forward(*a, TINY, SMALL, 0.3, True))(
        *(a.astype(jnp.float32) for a in (q, k, v)), idx)
    assert o.dtype == jnp.float32
    assert _rel(o, o_w) <= 5e-3
    np.testing.assert_allclose(np.asarray(lse), np.asarray(lse_w), rtol=0, atol=1e-4)


def _small_case(dtype):
    """Zero inputs of one small block-major case (shapes and dtypes only matter)."""
    B, T, h, G, D = 1, 32, 2, 1, 16
    q = jnp.zeros((B, T, h * G, D), dtype)
    kv = jnp.zeros((B, T, G, D), dtype)
    idx = jnp.zeros((B, T, G, TINY.n_sel), jnp.int32)
    o = jnp.zeros((B, T, h * G, D), jnp.float32)
    lse = jnp.zeros((B, T, h * G), jnp.float32)
    return q, kv, kv, idx, o, lse, o, None


def test_fused_backward_rejects_indices_of_other_slot_passes():
    """An index list from a forward that ran in other slot passes is an error naming it, more
    indices than passes as well as fewer (a zip over both would silently drop some)."""
    from nsa_jax.pallas.selection_block import slot_passes
    q, k, v, idx, o, lse, do, gs = _small_case(jnp.float32)
    assert len(slot_passes(idx.shape, q.shape[2], q.shape[3], q.dtype)) == 1
    for index in ((None,) * 3, ()):
        with pytest.raises(ValueError, match="indices for 1 slot"):
            sel_backward_block(q, k, v, idx, o, lse, do, gs, TINY, SMALL, 0.3, True,
                               index=index)


@pytest.mark.parametrize("dtype,want", [(jnp.bfloat16, jnp.bfloat16), (jnp.float32, jnp.float32)])
def test_block_partials_stored_in_16_bit_input_dtype(dtype, want):
    """The per-slot partial outputs (forward o_i, fused backward dQ_i) are stored in q's dtype
    when it is 16-bit, else in float32 (half the bytes that ``slot_passes`` budgets for)."""
    q, k, v, idx, o, lse, do, gs = _small_case(dtype)
    fwd = jax.make_jaxpr(lambda *a: sel_forward_block(*a, TINY, SMALL, 0.3, True))(q, k, v, idx)
    bwd = jax.make_jaxpr(lambda *a: sel_backward_block(*a, gs, TINY, SMALL, 0.3, True))(
        q, k, v, idx, o, lse, do)
    seen = {}
    for jp in (fwd, bwd):
        for e in jp.jaxpr.eqns:
            if e.primitive.name == "pallas_call":
                seen[str(e.params["name"])] = [a.aval.dtype for a in e.outvars]
    assert seen["nsa_sel_fwd_block"][0] == want            # po; plse stays float32
    assert seen["nsa_sel_fwd_block"][1] == jnp.float32
    assert seen["nsa_sel_bwd_block"][2] == want            # pdq; dk, dv accumulate in float32


def test_block_kernels_take_4_warps_at_128_wide_heads():
    """The block-major forward and fused backward (64-row tiles at 128-wide heads) take one
    warpgroup each at bf16 128-wide heads -- -20% each against 8 warps on an H100 at 8 / 2 / 128
    heads (bench/NOTES.md, thirtieth session) -- and follow ``num_warps``."""
    names = {"nsa_sel_fwd_block", "nsa_sel_bwd_block"}

    def warps(dtype, D, bs):
        q, k, v, idx, _, _, do, gs = _small_case(dtype)
        q, k, v, do = (jnp.zeros(x.shape[:-1] + (D,), dtype) for x in (q, k, v, q))

        def f(q, k, v):
            o, lse = sel_forward_block(q, k, v, idx, TINY, bs, 0.3, True)
            return sel_backward_block(q, k, v, idx, o, lse, do, gs, TINY, bs, 0.3, True)
        return kernel_warps(f, q, k, v, names=names)
    assert_launch_follows_num_warps(
        warps, dataclasses.replace(BlockSizes.for_shape(2, 128), sel_chunk=5))
