"""The decode step's RMSNorm folds (``Block._mlp_step``): the norm's scale folded into the next
matmul's weights and its row factor applied after the matmul, on the Pallas decode path only.
End to end the fused decode path is checked against the reference decoder in
``tests/test_decode.py::test_pallas_decode_path_with_fused_cache_writes_matches_reference``."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.decode import Decoder
from nsa_jax.model import Block, build_model
from nsa_jax.nsa import NSAConfig

SMALL = dict(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)


def _mcfg(attention="nsa", dtype="float32"):
    return ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, attention=attention, init_std=0.3, compute_dtype=dtype)


def _block(dtype):
    blk = build_model(_mcfg(dtype=dtype), NSAConfig(**SMALL), 0).blocks[0]
    # a norm scale away from 1, so a fold that dropped or doubled it would show
    blk.norm2.scale[...] = 0.5 + jax.random.uniform(jax.random.PRNGKey(7), (32,))
    blk.fuse_step_weights()
    return blk


def _rel_rmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def test_mlp_step_equals_norm_then_mlp_in_float32():
    blk = _block("float32")
    x = 3.0 * jax.random.normal(jax.random.PRNGKey(1), (5, 1, 32))
    np.testing.assert_allclose(blk._mlp_step(x), blk.mlp(blk.norm2(x)), rtol=2e-5, atol=2e-6)


def test_mlp_step_in_bf16_is_as_accurate_as_the_forwards_order():
    """In bf16 the fold rounds in other places (x W' is rounded before r scales it; the forward
    rounds x r g): both orders are compared with the float32 math of the same bf16 weights, and
    the folded one may not be worse than 1.5x the forward's order nor than 1e-2."""
    blk = _block("bfloat16")
    x = (3.0 * jax.random.normal(jax.random.PRNGKey(2), (64, 1, 32))).astype(jnp.bfloat16)
    xf = x.astype(jnp.float32)
    g = blk.norm2.scale[...].astype(jnp.bfloat16).astype(jnp.float32)
    w_in = blk.mlp.w_in.kernel[...].astype(jnp.bfloat16).astype(jnp.float32)
    w_out = blk.mlp.w_out.kernel[...].astype(jnp.bfloat16).astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + blk.norm2.epsilon)
    a, b = jnp.split((xf * r * g) @ w_in, 2, axis=-1)
    oracle = (jax.nn.silu(a) * b) @ w_out
    forward = _rel_rmse(blk.mlp(blk.norm2(x)).astype(jnp.float32), oracle)
    folded = _rel_rmse(blk._mlp_step(x).astype(jnp.float32), oracle)
    assert folded <= max(1.5 * forward, 1e-3) and folded <= 1e-2, (folded, forward)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_only_the_pallas_step_runs_the_folded_mlp(attention, monkeypatch):
    """Traced once per layer on the Pallas decode path (interpret mode here); the reference
    (XLA) decode path and the prefill keep the forward's norm + MLP."""
    calls = []
    real = Block._mlp_step
    monkeypatch.setattr(Block, "_mlp_step", lambda self, x: calls.append(1) or real(self, x))
    toks = jax.random.randint(jax.random.PRNGKey(4), (2, 12), 0, 97)
    for impl, want in (("pallas", 2), ("reference", 0)):
        calls.clear()
        model = build_model(_mcfg(attention), NSAConfig(**SMALL), 0, ExecConfig(decode_impl=impl))
        dec = Decoder(model, 2, 16)
        dec.prefill(toks[:, :8])
        assert calls == [], impl
        dec.step(toks[:, 8])
        assert len(calls) == want, impl
        blk = dec.step_graphdef.merge(dec.step_state).blocks[0]
        assert blk.w_in_step[...].shape == (32, 128)
        assert not hasattr(model.blocks[0], "w_in_step")   # the model itself is not changed


def test_w_in_step_is_the_scaled_input_projection():
    blk = _block("float32")
    want = np.asarray(blk.norm2.scale[...])[:, None] * np.asarray(blk.mlp.w_in.kernel[...])
    np.testing.assert_allclose(blk.w_in_step[...], want, rtol=1e-6)
