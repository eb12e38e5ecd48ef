"""A decode step's residual add + RMSNorm as one Pallas kernel (``pallas.add_norm``): the kernel
against its jax.numpy twin, the twin against the model's own modules, and the model's fused decode
step against its step block by block."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax import decode as kvcache
from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.decode import Decoder
from nsa_jax.model import build_model
from nsa_jax.nsa import NSAConfig
from nsa_jax.pallas.add_norm import add_rms_norm, add_rms_norm_reference
from nsa_testutil import rel_err


def _arrays(M, D, dtype, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return ((3.0 * jax.random.normal(ks[0], (M, D))).astype(dtype),
            jax.random.normal(ks[1], (M, D)).astype(dtype),
            (1.0 + 0.3 * jax.random.normal(ks[2], (D,))).astype(jnp.float32))


@pytest.mark.parametrize("M,D", [(1, 32), (3, 40), (8, 768), (19, 24)])
@pytest.mark.parametrize("with_a", [True, False])
def test_kernel_matches_its_twin_f32(M, D, with_a):
    """Rows not a multiple of the program's 8, a model dim not a power of two."""
    x, a, scale = _arrays(M, D, jnp.float32)
    a = a if with_a else None
    s, h = add_rms_norm(x, a, scale, eps=1e-6, dtype=jnp.float32)
    ws, wh = add_rms_norm_reference(x, a, scale, eps=1e-6, dtype=jnp.float32)
    assert rel_err(s, ws) <= 2e-7 and rel_err(h, wh) <= 2e-5, (rel_err(s, ws), rel_err(h, wh))


def test_kernel_bf16_rounds_as_its_twin():
    """bf16 in and out (interpret mode): the sum bit-equal to x + a, the normalised rows within
    one bf16 rounding of the twin's (the row sum's order differs)."""
    x, a, scale = _arrays(8, 768, jnp.bfloat16, seed=1)
    s, h = add_rms_norm(x, a, scale, eps=1e-6, dtype=jnp.bfloat16)
    ws, wh = add_rms_norm_reference(x, a, scale, eps=1e-6, dtype=jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(x + a, np.float32))
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(ws, np.float32))
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(wh, np.float32),
                               rtol=2 ** -7, atol=0)


def test_twin_is_the_model_expression_bf16():
    """The twin is ``x + a`` then ``nnx.RMSNorm(dtype=bf16)`` with a float32 scale, bit for bit."""
    x, a, scale = _arrays(5, 96, jnp.bfloat16, seed=2)
    norm = nnx.RMSNorm(96, epsilon=1e-6, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    norm.scale[...] = scale
    ws, wh = add_rms_norm_reference(x, a, scale, eps=1e-6, dtype=jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(ws, np.float32), np.asarray(x + a, np.float32))
    np.testing.assert_allclose(np.asarray(wh, np.float32), np.asarray(norm(x + a), np.float32),
                               rtol=2 ** -8, atol=0)


def test_bad_shapes_name_the_operand():
    x, a, scale = _arrays(2, 32, jnp.float32)
    with pytest.raises(ValueError, match="scale"):
        add_rms_norm(x, a, scale[:8], eps=1e-6, dtype=jnp.float32)
    with pytest.raises(ValueError, match="a \\["):
        add_rms_norm(x, a[:, :8], scale, eps=1e-6, dtype=jnp.float32)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_fused_decode_step_runs_the_kernels_and_equals_the_block_step(attention, monkeypatch):
    """``exec.decode_impl: pallas``: NSALM.extend's step goes through ``decode_step.fused_step``
    (the add + norm kernels) and gives the logits of the block-by-block step with the same
    attention kernels (the add + norm in XLA), float32, rows at different positions."""
    mcfg = ModelConfig(vocab_size=97, dim=40, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=48, attention=attention, init_std=0.3,
                       gate_bias=(0.5, -0.3, 0.2))
    model = build_model(mcfg, NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16),
                        0, ExecConfig(decode_impl="pallas"))
    toks = jax.random.randint(jax.random.PRNGKey(2), (3, 30), 0, 97)
    dec = Decoder(model, 3, 32)
    dec.prefill(toks[:, :20], lengths=[20, 7, 16])
    import nsa_jax.decode_step as ds
    calls = []
    real = ds.add_rms_norm
    monkeypatch.setattr(ds, "add_rms_norm", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    fused = np.asarray(jax.jit(lambda c, t: model.extend(t[:, None], c)[0])(dec.cache,
                                                                           toks[:, 20]))
    assert len(calls) == 2 * mcfg.n_layers + 1
    graphdef, state = nnx.split(model)

    def blockwise(cache, t):
        m = nnx.merge(graphdef, state)
        x = m.embed(t[:, None])
        pos = cache["pos"]
        for blk, kv in zip(m.blocks, cache["layers"]):
            a, _ = blk.attn(blk.norm1(x), pos[:, None],
                            kvcache.LayerCache(kv=kv, pos=pos, n=jnp.ones_like(pos)))
            x = x + a
            x = x + blk.mlp(blk.norm2(x))
        return m.norm(x)
    plain = np.asarray(jax.jit(blockwise)(dec.cache, toks[:, 20]))
    assert rel_err(fused, plain) <= 1e-6, rel_err(fused, plain)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [8, 64])
def test_gpu_kernel_bf16_matches_its_f32_twin(M):
    """Compiled, bf16, the 125M model's dim: relative RMSE <= 5e-3 against the twin in float32
    on the same (bf16-rounded) inputs; the sum bit-equal to XLA's bf16 x + a."""
    x, a, scale = _arrays(M, 768, jnp.bfloat16, seed=3)
    s, h = jax.jit(lambda x, a, sc: add_rms_norm(x, a, sc, eps=1e-6, dtype=jnp.bfloat16))(
        x, a, scale)
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(x + a, np.float32))
    _, wh = add_rms_norm_reference(s.astype(jnp.float32), None,
                                   scale.astype(jnp.bfloat16).astype(jnp.float32), eps=1e-6,
                                   dtype=jnp.float32)
    assert rel_err(h, wh) <= 5e-3, rel_err(h, wh)
