"""The fused chunked cross-entropy (nsa_jax/loss.py) against autodiff of the full-logits CE."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nsa_jax.loss import chunked_cross_entropy

B, T, D, V = 2, 37, 16, 53


def _inputs(dtype, seed=0):
    kh, kw, kt, km = jax.random.split(jax.random.PRNGKey(seed), 4)
    h = jax.random.normal(kh, (B, T, D), jnp.float32).astype(dtype)
    w = jax.random.normal(kw, (D, V), jnp.float32) * 0.5
    targets = jax.random.randint(kt, (B, T), 0, V)
    mask = (jax.random.uniform(km, (B, T)) < 0.7).astype(jnp.float32)
    # a negative id counted: indexing wraps it to V - 1 in the loss, so must the gradient
    targets, mask = targets.at[0, 3].set(-1), mask.at[0, 3].set(1.0)
    return h, w, targets, mask


def _full(h, w, targets, mask):
    """Reference: float32 logits of the whole sequence, masked mean CE."""
    logits = jnp.einsum("btd,dv->btv", h.astype(jnp.float32), w, precision="highest")
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(ce * mask) / jnp.sum(mask)


def _chunked(chunk):
    def f(h, w, targets, mask):
        total, count = chunked_cross_entropy(h, w, targets, chunk, mask)
        return total / count
    return f


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(b ** 2)) + 1e-30))


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_float32_loss_and_gradients_equal_full_logits(chunk):
    """Value and both gradients (h, w) equal autodiff of the unchunked CE, with a mask, a
    padded last chunk (37 = 2*16 + 5) and a chunk longer than T."""
    h, w, targets, mask = _inputs(jnp.float32)
    with jax.default_matmul_precision("highest"):
        l1, (dh1, dw1) = jax.jit(jax.value_and_grad(_chunked(chunk), argnums=(0, 1)))(
            h, w, targets, mask)
        l2, (dh2, dw2) = jax.jit(jax.value_and_grad(_full, argnums=(0, 1)))(h, w, targets, mask)
    assert abs(float(l1) - float(l2)) < 1e-5 * abs(float(l2))
    assert _rel(dh1, dh2) < 2e-6 and _rel(dw1, dw2) < 2e-6
    assert dh1.dtype == h.dtype and dw1.dtype == w.dtype
    # masked-out targets get no gradient into their hidden state
    assert float(jnp.max(jnp.abs(dh1 * (1 - mask)[..., None]))) == 0.0


def test_value_without_differentiation_and_cotangent_scaling():
    """The primal (eval) path gives the same value; the backward scales by the cotangent (the
    gradients are formed in the forward for a unit cotangent)."""
    h, w, targets, mask = _inputs(jnp.float32, seed=1)
    f = _chunked(8)
    with jax.default_matmul_precision("highest"):
        v = jax.jit(f)(h, w, targets, mask)
        l1, g1 = jax.value_and_grad(f, argnums=(0, 1))(h, w, targets, mask)
        g3 = jax.grad(lambda *a: -3.0 * f(*a), argnums=(0, 1))(h, w, targets, mask)
        g2 = jax.grad(_full, argnums=(0, 1))(h, w, targets, mask)
    assert abs(float(v) - float(l1)) < 1e-6 * abs(float(l1))
    for a, b, ref in zip(g1, g3, g2):
        assert _rel(b, -3.0 * a) < 1e-6
        assert _rel(a, ref) < 2e-6


def test_bfloat16_gradients_near_float32_reference():
    """bf16 activations: the gradient GEMMs take a bf16 dlogits; dh comes back in bf16 and dW in
    the weight's float32. Both stay within bf16 rounding of the float32 reference of the same
    (bf16-rounded) inputs."""
    h, w, targets, mask = _inputs(jnp.bfloat16, seed=2)
    l1, (dh1, dw1) = jax.jit(jax.value_and_grad(_chunked(16), argnums=(0, 1)))(
        h, w, targets, mask)
    with jax.default_matmul_precision("highest"):
        l2, (dh2, dw2) = jax.value_and_grad(_full, argnums=(0, 1))(
            h.astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32), targets, mask)
    assert dh1.dtype == jnp.bfloat16 and dw1.dtype == jnp.float32
    assert abs(float(l1) - float(l2)) < 1e-3 * abs(float(l2))
    assert _rel(dh1, dh2) < 1e-2 and _rel(dw1, dw2) < 1e-2
