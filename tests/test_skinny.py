"""``pallas.skinny``: the decode step's row-skinny matmuls with their fused RMSNorm, SwiGLU and
residual add, against their XLA twin (``skinny_reference``) and flax's RMSNorm."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.pallas.skinny import rms_norm, skinny_matmul, skinny_reference

MODES = {"plain": {}, "norm": {"norm": True}, "residual": {"residual": True},
         "norm_glu": {"norm": True, "glu": True}, "glu_residual": {"glu": True, "residual": True}}


def _args(M, K, N, dtype, mode, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = jax.random.normal(ks[0], (M, K)).astype(dtype)
    w = (jax.random.normal(ks[1], (K, N)) / np.sqrt(K)).astype(dtype)
    kw = {}
    if MODES[mode].get("norm"):
        kw["norm"] = ((1.0 + 0.1 * jax.random.normal(ks[2], (K,))).astype(dtype), 1e-5)
    if MODES[mode].get("glu"):
        kw["glu"] = True
    if MODES[mode].get("residual"):
        kw["residual"] = jax.random.normal(ks[3], (M, N // 2 if kw.get("glu") else N)).astype(dtype)
    return x, w, kw


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("M,K,N,bk", [(3, 64, 96, 32), (70, 96, 40, 64), (8, 48, 32, 16)])
def test_skinny_matches_xla_float32(mode, M, K, N, bk):
    """float32, interpret mode: == the XLA expression to float rounding, for row counts that are
    not a tile (3, 8) or span two row tiles (70 > 64), K not a multiple of the chunk (96 / 64,
    48 / 16 = 3 chunks) and output widths that leave a partial column slab (40, 48 / 16)."""
    x, w, kw = _args(M, K, N, jnp.float32, mode)
    got = skinny_matmul(x, w, interpret=True, bk=bk, **kw)
    want = skinny_reference(x, w, **kw)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", list(MODES))
def test_skinny_matches_xla_bf16_interpret(mode):
    """bf16, interpret mode: the kernel rounds where the XLA expression rounds (the matmul's
    output, the SwiGLU product, the residual sum), so both agree to one bf16 ulp of the
    output."""
    x, w, kw = _args(8, 128, 80, jnp.bfloat16, mode)
    got = skinny_matmul(x, w, interpret=True, bk=32, **kw).astype(jnp.float32)
    want = skinny_reference(x, w, **kw).astype(jnp.float32)
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_equals_flax(dtype):
    """The kernels' prologue arithmetic (``rms_norm``) == flax ``nnx.RMSNorm`` bitwise."""
    n = nnx.RMSNorm(64, epsilon=1e-5, dtype=dtype, rngs=nnx.Rngs(0))
    n.scale[...] = 1.0 + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (64,))
    x = jax.random.normal(jax.random.PRNGKey(2), (5, 64)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(n(x), np.float32),
                                  np.asarray(rms_norm(x, n.scale[...], 1e-5, dtype), np.float32))


def test_skinny_bad_shapes_are_one_clear_error():
    x = jnp.zeros((4, 32))
    with pytest.raises(ValueError, match=r"x \[M, K\] and w \[K, N\]"):
        skinny_matmul(x, jnp.zeros((16, 8)), interpret=True)
    with pytest.raises(ValueError, match="even width"):
        skinny_matmul(x, jnp.zeros((32, 9)), glu=True, interpret=True)
    with pytest.raises(ValueError, match=r"residual must be \[M, N\]"):
        skinny_matmul(x, jnp.zeros((32, 16)), residual=jnp.zeros((4, 8)), interpret=True)
    with pytest.raises(ValueError, match="norm scale"):
        skinny_matmul(x, jnp.zeros((32, 16)), norm=(jnp.ones(16), 1e-5), interpret=True)
    with pytest.raises(ValueError, match="bn must be a power of two"):
        skinny_matmul(x, jnp.zeros((32, 16)), bn=24, interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("M", [1, 8, 70])
def test_gpu_skinny_bf16_matches_xla(mode, M):
    """Compiled (Triton), bf16, the 125M block's widths: relative RMSE <= 5e-3 against the
    float32 XLA expression, and no further from it than XLA's own bf16 run plus 1e-3."""
    K, N = (2048, 768) if mode == "residual" else (768, 1572 if mode != "norm_glu" else 4096)
    x, w, kw = _args(M, K, N, jnp.bfloat16, mode, seed=M)
    f32 = lambda a: None if a is None else a.astype(jnp.float32)
    kw32 = dict(kw)
    if "norm" in kw:
        kw32["norm"] = (f32(kw["norm"][0]), kw["norm"][1])
    if "residual" in kw:
        kw32["residual"] = f32(kw["residual"])
    want = np.asarray(skinny_reference(f32(x), f32(w), **kw32))
    got = np.asarray(jax.jit(lambda x: skinny_matmul(x, w, interpret=False, **kw))(x), np.float32)
    xla = np.asarray(jax.jit(lambda x: skinny_reference(x, w, **kw))(x), np.float32)
    rr = lambda a: float(np.sqrt(np.mean((a - want) ** 2) / np.mean(want ** 2)))
    assert rr(got) <= 5e-3 and rr(got) <= rr(xla) + 1e-3, (rr(got), rr(xla))


@pytest.mark.parametrize("mode", list(MODES))
def test_skinny_transposed_weight_layout(mode):
    """``w_nk=True`` (w stored [N, K]) gives the [K, N] kernel's result, float32 interpret."""
    x, w, kw = _args(5, 96, 48, jnp.float32, mode)
    np.testing.assert_allclose(skinny_matmul(x, w.T, w_nk=True, interpret=True, bk=32, **kw),
                               skinny_reference(x, w, **kw), rtol=2e-5, atol=2e-5)
