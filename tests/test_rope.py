"""RoPE's custom VJP (``nsa_jax.nsa.rope``) against jax's autodiff of the plain rotation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa.rope import apply_rope, rope_freqs


def _plain(x, positions, theta=10000.0):
    ang = positions.astype(jnp.float32)[..., None] * rope_freqs(x.shape[-1], theta)
    if ang.ndim == 2:
        ang = ang[None]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


POSITIONS = {"shared": jnp.arange(7) * 5, "per_row": (jnp.arange(14).reshape(2, 7) * 37) % 50}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("pos", sorted(POSITIONS))
def test_forward_and_gradient_equal_autodiff(dtype, pos):
    """The forward is the plain rotation; the backward (the rotation by -angle) equals autodiff
    of it to float32 rounding (the same products, summed in the same order, rounded once)."""
    positions = POSITIONS[pos]
    kx, kd = jax.random.split(jax.random.PRNGKey(11))
    x = jax.random.normal(kx, (2, 7, 3, 16)).astype(dtype)
    dy = jax.random.normal(kd, (2, 7, 3, 16)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(apply_rope(x, positions), np.float32),
                                  np.asarray(_plain(x, positions), np.float32))
    got = jax.vjp(lambda x: apply_rope(x, positions), x)[1](dy)[0]
    want = jax.vjp(lambda x: _plain(x, positions), x)[1](dy)[0]
    assert got.dtype == x.dtype
    tol = 1e-6 if dtype == jnp.float32 else 2.0**-8
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=1e-6)


def test_gradient_is_the_inverse_rotation():
    """A rotation is orthogonal: the VJP of the rotation maps the rotated vector back."""
    x = jax.random.normal(jax.random.PRNGKey(2), (1, 5, 2, 8))
    positions = jnp.arange(5) * 1000
    y, vjp = jax.vjp(lambda x: apply_rope(x, positions), x)
    np.testing.assert_allclose(np.asarray(vjp(y)[0]), np.asarray(x), rtol=1e-5, atol=1e-5)


def test_grad_under_jit_with_traced_positions():
    positions = jnp.arange(6)
    x = jax.random.normal(jax.random.PRNGKey(4), (1, 6, 2, 8))
    f = jax.jit(jax.grad(lambda x, p: jnp.sum(jnp.sin(apply_rope(x, p)))))
    want = jax.grad(lambda x: jnp.sum(jnp.sin(_plain(x, positions))))(x)
    np.testing.assert_allclose(np.asarray(f(x, positions)), np.asarray(want), rtol=1e-6, atol=1e-6)
