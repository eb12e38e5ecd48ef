"""Compressed attention as a grouped causal attention (``nsa_jax.pallas.cmp_grouped``,
``KernelChoices.cmp_attn``): the XLA twin against the reference and the Pallas lse, and the whole
op with ``cmp_attn="xla"`` against the reference (values and all 8 gradients, float32, <= 2e-5).
The cuDNN call itself runs only on a GPU (tests/test_pallas_gpu.py)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped, group_keys, group_queries, ungroup
from nsa_jax.pallas.common import POS_INF
from nsa_jax.pallas.compressed import cmp_forward
from nsa_testutil import rel_err
from test_pallas import TINY, _assert_parity, _inputs

HI = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
@pytest.mark.parametrize("cfg,T", [
    (TINY, 37),                                            # l=8, d=4, odd T
    (NSAConfig(block_l=32, stride_d=16, sel_block=64, n_sel=4, window=32), 95),
    (TINY, 5),                                              # T < l: no block
])
def test_grouped_matches_reference_and_pallas_lse(cfg, T, grouping):
    (q, kc, vc, *_), _ = _inputs(T, 2, T, 6, 2, cfg, Dk=16, Dv=8)
    o, lse = jax.jit(lambda *a: cmp_attention_grouped(*a, cfg, "xla", HI, grouping=grouping))(
        q, kc, vc)
    if kc.shape[1] == 0:
        assert np.all(np.asarray(o) == 0) and np.all(np.asarray(lse) == POS_INF)
        return
    assert rel_err(o, ref.compressed_attention(q, kc, vc, cfg)) <= 2e-5
    _, want = cmp_forward(q, kc, None, cfg, BlockSizes(), 0.25, True)
    lse, want = np.asarray(lse), np.asarray(want)
    np.testing.assert_array_equal(lse == POS_INF, want == POS_INF)   # t < l - 1: no block
    fin = want != POS_INF
    assert fin.any()
    np.testing.assert_allclose(lse[fin], want[fin], rtol=0, atol=2e-5)


@pytest.mark.parametrize("grouping", ["transpose", "repeat"])
def test_group_and_ungroup_are_inverse_on_the_queries_that_see_a_block(grouping):
    cfg = TINY
    T, G, Hq = 29, 2, 6
    q = jnp.arange(2 * T * Hq, dtype=jnp.float32).reshape(2, T, Hq, 1)
    Tq = cfg.num_cmp_blocks(T)
    back = ungroup(group_queries(q, cfg, G, Tq, grouping), T, cfg, G, -1.0, grouping)
    np.testing.assert_array_equal(back[:, cfg.block_l - 1:], q[:, cfg.block_l - 1:])
    assert np.all(np.asarray(back[:, :cfg.block_l - 1]) == -1)


def test_repeat_grouping_pairs_each_query_head_with_its_groups_keys():
    """In the "repeat" order, query head (r, g, i) of a grouped row and KV head r*G + g (GQA
    ratio h, contiguous) hold query t = l-1 + c*d + r of head g*h + i and key group g."""
    cfg, G, h = TINY, 2, 3
    d, l, Hq, T = cfg.stride_d, cfg.block_l, G * h, 40
    t = jnp.arange(T, dtype=jnp.float32)
    q = t[None, :, None, None] * 100 + jnp.arange(Hq, dtype=jnp.float32)[None, None, :, None]
    Tq = cfg.num_cmp_blocks(T)
    qg = np.asarray(group_queries(q, cfg, G, Tq, "repeat"))[0, :, :, 0]       # [Tq, d*Hq]
    k = jnp.broadcast_to(jnp.arange(G, dtype=jnp.float32)[None, None, :, None], (1, Tq, G, 1))
    kg = np.asarray(group_keys(k, d, "repeat"))[0, :, :, 0]                   # [Tq, d*G]
    for c in range(Tq):
        for r in range(d):
            for g in range(G):
                for i in range(h):
                    n = r * Hq + g * h + i
                    tq = l - 1 + c * d + r
                    assert qg[c, n] == (tq * 100 + g * h + i if tq < T else 0)
                    assert kg[c, n // h] == g


@pytest.mark.parametrize("sel", [
    {},                                                  # the tiled selection (short T)
    # the gather selection's backwards, which run beside cuDNN's grouped branch at long T
    {"sel_impl": "gather", "sel_dq": "query"},
    {"sel_impl": "gather", "sel_dq": "ds"},
    {"sel_impl": "gather", "sel_bwd": "atomic"},
    {"sel_impl": "gather", "sel_fwd": "block", "sel_dq": "block"},
])
def test_op_with_grouped_cmp_matches_reference(sel):
    h, G = 3, 2                       # several groups and several heads per group
    args, cot = _inputs(11 + h, 1, 45, h * G, G, TINY)
    _assert_parity(args, cot, TINY, choices=KernelChoices(cmp_attn="xla", **sel))


def test_op_with_repeat_grouping_matches_reference():
    """The "repeat" head order through the whole op: values and all 8 gradients (the keys'
    through the repeat's sum over r)."""
    h, G = 3, 2
    args, cot = _inputs(21, 1, 45, h * G, G, TINY)
    _assert_parity(args, cot, TINY, choices=KernelChoices(cmp_attn="xla", cmp_grouping="repeat",
                                                           sel_impl="gather"))


@pytest.mark.parametrize("branches,T", [(("cmp", "win"), 37), (("cmp", "slc"), 37),
                                        (("cmp", "slc", "win"), 5)])
def test_op_with_grouped_cmp_branch_subsets(branches, T):
    """The grouped compressed branch without the selection, without the window, and at T < l
    (no compressed block)."""
    cfg = dataclasses.replace(TINY, branches=branches)
    args, cot = _inputs(7, 1, T, 4, 2, cfg)
    _assert_parity(args, cot, cfg, choices=KernelChoices(cmp_attn="xla", sel_impl="gather"))


@pytest.mark.parametrize("key", ["cmp_attn", "win_attn"])
def test_cudnn_choice_off_gpu_is_one_clear_error(key):
    """An explicit "cudnn" for the compressed or the window branch where cuDNN cannot run (here:
    interpret mode), and an unknown choice: one error naming the key."""
    from nsa_jax.nsa import nsa_attention
    args, _ = _inputs(0, 1, 16, 2, 1, TINY)
    with pytest.raises(ValueError, match=f"kernel.{key}"):
        nsa_attention(*args, TINY, impl="pallas", choices=KernelChoices(**{key: "cudnn"}))
    with pytest.raises(ValueError, match=f"kernel.{key}"):
        KernelChoices(**{key: "flash"})


@pytest.mark.parametrize("T,packed,choices,want", [
    (4096, False, KernelChoices(), "pallas"),                  # short rows: Pallas
    (4097, False, KernelChoices(), "cudnn"),
    (4097, True, KernelChoices(), "pallas"),                   # packed rows: always Pallas
    (2048, False, KernelChoices(cmp_pallas_max_t=0), "cudnn"),
    (2048, False, KernelChoices(cmp_attn="cudnn"), "cudnn"),
    (9000, False, KernelChoices(cmp_attn="pallas"), "pallas"),
])
def test_auto_cmp_attn_by_row_length(T, packed, choices, want):
    """cmp_attn "auto" on operands cuDNN can run (bf16, compiled): cuDNN above
    ``cmp_pallas_max_t`` tokens, the Pallas kernels at or below it and for packed rows."""
    from nsa_jax.pallas.nsa import _cmp_attn, _Static
    q = jax.ShapeDtypeStruct((1, T, 4, 64), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((1, 8, 2, 64), jnp.bfloat16)
    st = _Static(TINY, BlockSizes(), choices, False, True)
    assert _cmp_attn(q, v, st, packed) == want
