"""dQ from the dK/dV kernel's stored dS (``KernelChoices.sel_dq = "ds"``) in interpret mode: the
inverted dK/dV kernel stores each (query, slot)'s dS in the index's entry order and a query-major
kernel sums dS K over the slots. dq, dk, dv equal the per-query dQ + inverted dK/dV backward's
(float32, <= 2e-5), with unused slots and blocks past the query, several key sub-tiles per block,
h in {1, 2, 6, 16}, the index built here or taken from the block-major forward; the whole op with
it matches the reference (values and all 8 gradients); the entry positions invert the sort; the
inputs it refuses."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, nsa_attention
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.selection import ds_mode, entry_positions, inverted_index, sel_backward
from nsa_jax.pallas.selection_block import sel_forward_block
from test_pallas import TINY, _assert_parity, _inputs, _rel
from test_selection_block import SMALL, _random_idx, backward_case

DS = KernelChoices(sel_impl="gather", sel_fwd="query", sel_dq="ds")
QUERY = KernelChoices(sel_impl="gather", sel_fwd="query", sel_dq="query")


@pytest.mark.parametrize("h,G,cfg,bs", [
    (6, 1, TINY, SMALL),                       # several tiles per item, several items per block
    (16, 1, TINY, BlockSizes.for_shape(16, 16, 4)),
    (1, 2, TINY, BlockSizes()),
    # two key sub-tiles per block (l' = 32, 16-key tiles): dS columns stored per sub-tile
    (2, 1, dataclasses.replace(TINY, sel_block=32), dataclasses.replace(SMALL, sel_rows=32))])
def test_ds_backward_equals_query_backward(h, G, cfg, bs):
    q, k, v, idx, o, lse, do, gs = backward_case(10 + h, h, G, cfg, bs)   # T = 53: odd
    bwd = lambda ch, ix=None: jax.jit(lambda *a: sel_backward(  # noqa: E731
        *a, cfg, bs, 0.3, True, choices=ch, index=ix))(q, k, v, idx, o, lse, do, gs)
    want = bwd(QUERY)
    # the block-major forward's index (slot payloads) serves the dS rows too
    index = jax.jit(lambda *a: sel_forward_block(*a, cfg, bs, 0.3, True, return_index=True)[2])(
        q, k, v, idx)
    assert len(index) == 1
    for got in (bwd(DS), bwd(DS, index[0])):
        assert float(jnp.abs(got[0]).max()) > 0
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            assert _rel(a, b) <= 2e-5


def test_entry_positions_invert_the_index():
    cfg = TINY
    idx = _random_idx(3, 2, 40, 2, cfg)
    _, qt = inverted_index(idx, 40, cfg.num_sel_blocks(40), 8, cfg.sel_block, slots=True)
    pos = np.asarray(entry_positions(qt))
    qt = np.asarray(qt)
    for b in range(2):
        for g in range(2):
            assert sorted(qt[b, g]) == list(range(qt.shape[-1]))    # a permutation
            np.testing.assert_array_equal(qt[b, g][pos[b, g]], np.arange(qt.shape[-1]))


def test_op_with_ds_matches_reference():
    """The op with sel_dq "ds" (per-query forward, inverted dK/dV storing dS, dQ from dS):
    values and all 8 gradients against the reference, odd T, B = 2; the op's backward runs the
    dQ-from-dS kernel and not the per-query dQ kernel."""
    args, cot = _inputs(33, 2, 75, 4, 2, TINY)
    _assert_parity(args, cot, TINY, block_sizes=SMALL, choices=DS)

    def loss(*a):
        return jnp.sum(nsa_attention(*a, TINY, impl="pallas", choices=DS, block_sizes=SMALL)
                       * cot)
    text = str(jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(8))))(*args))
    assert set(re.findall(r"nsa_sel_[a-z_]+", text)) == {
        "nsa_sel_fwd", "nsa_sel_bwd_dkv", "nsa_sel_bwd_dq_ds"}


def test_ds_is_explicit_and_refuses_packed_rows_and_the_atomic_backward():
    assert ds_mode(DS, False)
    assert not ds_mode(None, False) and not ds_mode(QUERY, False)
    with pytest.raises(ValueError, match="kernel.sel_dq: 'ds' takes unpacked rows"):
        ds_mode(DS, True)
    with pytest.raises(ValueError, match="kernel.sel_dq: 'ds' .* needs kernel.sel_bwd"):
        KernelChoices(sel_dq="ds", sel_bwd="atomic")
