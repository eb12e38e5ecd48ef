"""The scoring kernel's key-range splits (``BlockSizes.score_splits``, NSA Eq. 9-10): a program
per range of score columns, each range recomputing the spill of the step before it. Every split
count gives the unsplit kernel's scores element by element within float32 rounding (interpret
mode; XLA compiles each grid's loops apart, so the last bit may differ), unpacked, packed and in
a continuation chunk. A range that lost the spill owed to its first block would be off by that
block's share of a compressed block's probability, far outside it (that mutation fails every
parity case here; bench/NOTES.md, fifty-first session)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig, semantics
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes, block_scores_pallas
from nsa_jax.pallas.scoring import score_splits
from nsa_testutil import chunk_inputs, rel_err
from packed_util import packed_inputs

# l = 8, d = 4, l' = 16: r = 4 compressed blocks start in each selection block and the last of
# them spills into the next one (the carry a range must recompute)
CFG = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1, n_local=1)
GEN = dataclasses.replace(CFG, sel_block=12)   # l'/d = 3: the general (dot) path


def _same(got, want, what):
    """Element by element within float32 rounding of the unsplit result."""
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7 * float(np.abs(want).max()),
                               err_msg=what)


def _scores(q, kc, cfg, layout, splits, **kw):
    bs = BlockSizes(score_q=16, score_splits=splits)
    return np.asarray(jax.jit(lambda a, b: block_scores_pallas(
        a, b, cfg, bs, choices=KernelChoices(score_heads=layout), **kw))(q, kc))


@pytest.mark.parametrize("cfg,layout", [(CFG, "loop"), (CFG, "rows"), (GEN, "loop")],
                         ids=["fast-loop", "fast-rows", "general-loop"])
def test_splits_equal_the_unsplit_scores(cfg, layout):
    """T = 1,250: 79 selection blocks in 5 column tiles of 16 (score_sel), so 2 and 3 splits cut
    inside the visible steps of the later query tiles and 8 leaves empty ranges; the query tiles
    see 1 to 5 steps (ranges that start at, before and past a tile's last visible step)."""
    T, h = 1250, 3
    ks = jax.random.split(jax.random.PRNGKey(3), 2)
    q = jax.random.normal(ks[0], (1, T, h, 8), jnp.float32)
    kc = jax.random.normal(ks[1], (1, cfg.num_cmp_blocks(T), 1, 8), jnp.float32)
    one = _scores(q, kc, cfg, layout, 1)
    want = ref.block_scores(ref.cmp_probs(q, kc, cfg), T, cfg)
    assert rel_err(one, want) <= 1e-6
    assert float(np.abs(one[:, -1, :, -2]).max()) > 0   # the last visible block is scored
    for n in (2, 3, 8):
        _same(_scores(q, kc, cfg, layout, n), one, f"{n} splits")


def test_splits_equal_the_unsplit_scores_packed():
    """Packed rows: each document's pass walks the split's range of its own columns."""
    cfg = dataclasses.replace(CFG, sel_block=16)
    args, seg = packed_inputs(4, [[700, 9, 541]], 6, 2, 8, 8, cfg)
    q, kc = args[0], args[1]
    lay = semantics.segment_layout(seg, cfg)
    want = ref.block_scores(ref.cmp_probs(q, kc, cfg, lay), q.shape[1], cfg, lay)
    one = _scores(q, kc, cfg, "loop", 1, segment_ids=seg)
    assert rel_err(one, want) <= 1e-6
    for n in (2, 3):
        _same(_scores(q, kc, cfg, "loop", n, segment_ids=seg), one, f"{n} splits")


def test_chunk_with_splits_equals_the_unsplit_chunk():
    """A continuation chunk (queries at 1,024 .. 1,055 over a 1,400-token cache, 88 score
    columns) through ``nsa_chunk_pallas``: 1, 3 and the automatic split count agree (the
selection may differ only where rounding flips a tie, which these random inputs do not hold)."""
    from nsa_jax.pallas.chunk import nsa_chunk_pallas
    q, lc, span, t, gates = chunk_inputs(5, CFG, 1, 2, 3, 8, 32, 1400, 16, 1024)
    outs = [np.asarray(nsa_chunk_pallas(q, lc, span, t, gates, CFG, block_sizes=bs))
            for bs in (BlockSizes(score_splits=1), BlockSizes(score_splits=3), None)]
    _same(outs[1], outs[0], "3 splits")
    _same(outs[2], outs[0], "auto")


def test_auto_split_rule():
    """Split until the grid has 512 programs, in powers of two up to 8, never more ranges than
    half the column tiles allow."""
    assert score_splits(128, 65) == 4      # a 4,096-query chunk of the 125M model
    assert score_splits(512, 65) == 1      # a 16,384-query chunk; training shapes have more
    assert score_splits(1, 100) == 8
    assert score_splits(2, 3) == 2
    assert score_splits(2, 1) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_split_count_is_one_error(bad):
    with pytest.raises(ValueError, match="score_splits"):
        BlockSizes(score_splits=bad)


@pytest.mark.gpu
def test_gpu_chunk_scores_with_splits_equal_the_unsplit():
    """Compiled (Triton): a continuation chunk's block scores at the 125M heads (h = 6, 64-wide,
    bf16), 1,024 queries at 63,488 over a 65,600-token cache (1,025 columns, 65 column tiles):
    2, 4 and 8 splits give the unsplit scores within float32 rounding."""
    from nsa_jax.pallas.chunk import offset_layout
    from nsa_jax.pallas.compressed import cmp_forward
    from nsa_jax.pallas.scoring import cmp_block_scores
    cfg = NSAConfig()
    B, G, h, D, C, S, start = 1, 2, 6, 64, 1024, 65600, 63488
    ks = jax.random.split(jax.random.PRNGKey(7), 2)
    q = jax.random.normal(ks[0], (B, C, G * h, D), jnp.bfloat16)
    Tc = cfg.num_cmp_blocks(S)
    kc = jax.random.normal(ks[1], (B, Tc, G, D), jnp.bfloat16)
    lay = offset_layout(B, C, start, Tc, cfg.stride_d)
    bs = BlockSizes.for_shape(h, D, 2)
    _, lse = cmp_forward(q, kc, None, cfg, bs, D ** -0.5, False, seg=lay)

    def scores(n):
        b = dataclasses.replace(bs, score_splits=n)
        return np.asarray(jax.jit(lambda a, k, s: cmp_block_scores(
            a, k, s, cfg, b, D ** -0.5, False, seg=lay, Ts=S // cfg.sel_block))(q, kc, lse))
    one = scores(1)
    assert float(np.abs(one[:, -1, :, (start + C) // cfg.sel_block - 2]).max()) > 0
    for n in (2, 4, 8):
        _same(scores(n), one, f"{n} splits")
