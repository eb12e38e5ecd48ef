"""dQ chained through the branch kernels (``nsa.py``'s backward): the Pallas compressed dQ kernel
and the Triton tiled selection dQ kernel take the dQ so far (``dq_in``) and add their own to it
in float32 before they store, in ``dq_dtype``. Interpret mode on the CPU, float32: with dq_in
each kernel's dQ equals its dQ without plus dq_in (<= 2e-5), for unpacked and packed rows, a
bf16 dq_in, a bf16 result, and T < l (no compressed block: dq_in passes through)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import NSAConfig, semantics
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.compressed import cmp_backward, cmp_forward
from nsa_jax.pallas.selection_tiled import sel_tiled_backward, sel_tiled_forward
from nsa_testutil import rel_err

TOL = 2e-5
CFG = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1, n_local=1)
BS = BlockSizes(sel_tile_q=16, sel_keys=16)
B, G, h, D = 2, 2, 2, 16
Hq = G * h


def _inputs(T, seed):
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    n = lambda k, s: jax.random.normal(k, s, jnp.float32)
    Tc = CFG.num_cmp_blocks(T)
    return dict(q=n(ks[0], (B, T, Hq, D)), kc=n(ks[1], (B, Tc, G, D)), vc=n(ks[2], (B, Tc, G, D)),
                k=n(ks[3], (B, T, G, D)), v=n(ks[4], (B, T, G, D)), do=n(ks[5], (B, T, Hq, D)),
                dq_in=n(ks[6], (B, T, Hq, D)),
                gs=jax.random.uniform(ks[7], (B, T, Hq), minval=0.2, maxval=1.0))


def _seg(T, packed):
    if not packed:
        return None, None
    ids = jnp.asarray(np.repeat([[0, 1, 2]], B, 0).repeat([29, 40, T - 69], axis=1))
    return semantics.segment_layout(ids, CFG), ids


def _check(with_in, without, dq_in, dtype, plain_zero=False):
    assert with_in.dtype == dtype, with_in.dtype
    assert float(jnp.abs(dq_in).max()) > 0.1
    # the kernel's own dQ is not vacuous, except where no key is visible (T < l)
    assert (float(jnp.abs(without).max()) == 0.0) == plain_zero
    want = without.astype(jnp.float32) + dq_in.astype(jnp.float32)
    err = rel_err(with_in.astype(jnp.float32), want)
    # a dtype rounding of the result is allowed only when the result is rounded
    tol = TOL if dtype == jnp.float32 else 2 ** -8
    assert err <= tol, f"dq with dq_in off by {err:.2e} (> {tol})"


@pytest.mark.parametrize("T,packed,in_dtype,out_dtype", [
    (75, False, jnp.float32, jnp.float32),
    (75, False, jnp.bfloat16, jnp.float32),      # the window's cuDNN dQ, bf16
    (109, True, jnp.float32, jnp.bfloat16),      # packed rows, rounded once at the end
    (7, False, jnp.float32, jnp.float32),        # T < l: no compressed block
])
def test_cmp_backward_adds_dq_in(T, packed, in_dtype, out_dtype):
    x = _inputs(T, T)
    seg, _ = _seg(T, packed)
    scale = 1.0 / math.sqrt(D)
    dq_in = x["dq_in"].astype(in_dtype)

    @jax.jit
    def run(x, dq_in):
        o, lse = cmp_forward(x["q"], x["kc"], x["vc"], CFG, BS, scale, True, seg=seg)
        args = (x["q"], x["kc"], x["vc"], o, lse, x["do"], x["gs"], None, CFG, BS, scale, True)
        plain = cmp_backward(*args, seg=seg)
        chained = cmp_backward(*args, seg=seg, dq_in=dq_in, dq_dtype=out_dtype)
        return plain, chained
    plain, chained = run(x, dq_in)
    _check(chained[0], plain[0], dq_in, out_dtype, plain_zero=T < CFG.block_l)
    for a, b in zip(plain[1:], chained[1:]):     # dK, dV untouched
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("T,packed,in_dtype,out_dtype", [
    (75, False, jnp.float32, jnp.float32),
    (75, False, jnp.bfloat16, jnp.bfloat16),
    (109, True, jnp.float32, jnp.float32),
])
def test_sel_tiled_backward_adds_dq_in(T, packed, in_dtype, out_dtype):
    x = _inputs(T, T + 1)
    seg, ids = _seg(T, packed)
    scale = 1.0 / math.sqrt(D)
    idx = ref.select_blocks(x["q"], x["kc"], CFG, ids)
    dq_in = x["dq_in"].astype(in_dtype)

    @jax.jit
    def run(x, idx, dq_in):
        o, lse = sel_tiled_forward(x["q"], x["k"], x["v"], idx, CFG, BS, scale, True, seg=seg)
        args = (x["q"], x["k"], x["v"], idx, o, lse, x["do"], x["gs"], CFG, BS, scale, True)
        plain = sel_tiled_backward(*args, seg=seg)
        chained = sel_tiled_backward(*args, seg=seg, dq_in=dq_in, dq_dtype=out_dtype)
        return plain, chained
    plain, chained = run(x, idx, dq_in)
    _check(chained[0], plain[0], dq_in, out_dtype)
    for a, b in zip(plain[1:], chained[1:]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sel_tiled_backward_rejects_dq_in_with_another_dq_kernel():
    x = _inputs(32, 0)
    idx = jnp.zeros((B, 32, G, CFG.n_sel), jnp.int32)
    with pytest.raises(ValueError, match="dq_in / dq_dtype need the Triton dQ kernel"):
        sel_tiled_backward(x["q"], x["k"], x["v"], idx, x["q"], jnp.zeros((B, 32, Hq)), x["do"],
                           None, CFG, BS, 0.1, True, dq_kernel=lambda *a, **k: None,
                           dq_in=x["dq_in"])
