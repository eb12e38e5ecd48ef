"""The SwiGLU gate's custom VJP (``nsa_jax.swiglu``) against jax's autodiff of the plain form."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.swiglu import swiglu


def _plain(u):
    a, b = jnp.split(u, 2, axis=-1)
    return jax.nn.silu(a) * b


def _inputs(dtype, shape=(2, 7, 24)):
    ku, kd = jax.random.split(jax.random.PRNGKey(3))
    u = (3.0 * jax.random.normal(ku, shape)).astype(dtype)
    dh = jax.random.normal(kd, shape[:-1] + (shape[-1] // 2,)).astype(dtype)
    return u, dh


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forward_is_the_plain_expression_bitwise(dtype):
    u, _ = _inputs(dtype)
    np.testing.assert_array_equal(np.asarray(swiglu(u), np.float32),
                                  np.asarray(_plain(u), np.float32))


def test_float32_gradient_matches_autodiff():
    u, dh = _inputs(jnp.float32)
    got = jax.vjp(swiglu, u)[1](dh)[0]
    want = jax.vjp(_plain, u)[1](dh)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)


def test_bf16_gradient_is_the_float32_one_rounded_once():
    """bf16 inputs: du is formed in float32 and rounded once, so it is within bf16's unit
    roundoff (2^-8 relative: 8 significant bits) of the float32 gradient at the same
    (bf16-valued) inputs; the 1e-5 share is the float32 formulas' own difference."""
    u, dh = _inputs(jnp.bfloat16)
    got = np.asarray(jax.vjp(swiglu, u)[1](dh)[0], np.float32)
    want = np.asarray(jax.vjp(_plain, u.astype(jnp.float32))[1](dh.astype(jnp.float32))[0])
    np.testing.assert_allclose(got, want, rtol=2.0**-8 * (1 + 1e-5), atol=1e-30)


def test_gradient_of_the_mlp_through_jit_and_grad():
    """Used as the model uses it: inside a projection, under jit and grad."""
    kx, k1, k2 = jax.random.split(jax.random.PRNGKey(5), 3)
    x = jax.random.normal(kx, (9, 6))
    w1, w2 = jax.random.normal(k1, (6, 10)), jax.random.normal(k2, (5, 6))

    def loss(act, w1, w2):
        return jnp.sum(jnp.tanh(act(x @ w1) @ w2))

    got = jax.jit(jax.grad(lambda a, b: loss(swiglu, a, b), argnums=(0, 1)))(w1, w2)
    want = jax.grad(lambda a, b: loss(_plain, a, b), argnums=(0, 1))(w1, w2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_odd_last_axis_is_one_clear_error():
    with pytest.raises(ValueError, match=r"\[a \| b\]"):
        swiglu(jnp.ones((3, 5)))
