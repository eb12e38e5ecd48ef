"""The decode step's dense layers as Pallas kernels (``pallas.decode_layers``) against the
modules they replace (flax RMSNorm and Linear, ``swiglu``), alone and in the Decoder."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.decode import Decoder
from nsa_jax.model import build_model, fused_layers
from nsa_jax.nsa import NSAConfig
from nsa_jax.pallas.decode_layers import linear_add, norm_linear, norm_swiglu
from nsa_jax.swiglu import swiglu
from nsa_testutil import rel_err

SMALL = dict(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)


def _inputs(B, K, N, dtype, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = (jax.random.normal(ks[0], (B, K)) * 2.0).astype(dtype)
    scale = (1.0 + 0.5 * jax.random.normal(ks[1], (K,))).astype(dtype)
    w = (jax.random.normal(ks[2], (K, N)) / np.sqrt(K)).astype(dtype)
    res = jax.random.normal(ks[3], (B, N)).astype(dtype)
    return x, scale, w, res


def _want(mode, x, scale, w, res, eps):
    """The modules' computation: flax RMSNorm (dtype = x's), a Linear's matmul, swiglu, +."""
    dt = x.dtype
    norm = nnx.RMSNorm(x.shape[1], epsilon=eps, dtype=dt, param_dtype=dt, rngs=nnx.Rngs(0))
    norm.scale[...] = scale
    hi = jax.lax.Precision.HIGHEST
    if mode == "norm":
        return jnp.dot(norm(x), w, precision=hi)
    if mode == "swiglu":
        return swiglu(jnp.dot(norm(x), w, precision=hi))
    return res + jnp.dot(x, w, precision=hi)


# B not a power of two, K and N not multiples of the tiles, several K steps and column tiles
SHAPES = [(3, 40, 50), (20, 96, 36), (1, 16, 16)]


@pytest.mark.parametrize("unroll", [True, False])
@pytest.mark.parametrize("B,K,N", SHAPES)
@pytest.mark.parametrize("mode", ["norm", "swiglu", "add"])
def test_kernels_match_the_modules_float32(mode, B, K, N, unroll):
    x, scale, w, res = _inputs(B, K, 2 * N if mode == "swiglu" else N, jnp.float32)
    tiles = dict(cols=16, k_step=16, unroll=unroll)
    if mode == "norm":
        got = norm_linear(x, scale, 1e-5, w, **tiles)
    elif mode == "swiglu":
        got = norm_swiglu(x, scale, 1e-5, w, **tiles)
    else:
        got = linear_add(x, w, res, **tiles)
    want = _want(mode, x, scale, w, res, 1e-5)
    assert got.shape == want.shape == (B, N) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", ["norm", "swiglu", "add"])
def test_kernels_match_the_modules_bf16_within_a_rounding(mode):
    """bf16: the same roundings as the modules; the float32 accumulations differ only in
    order, so a matmul's output may sit one bf16 step (2^-8 relative, 2^-7 with the floor) away;
    SwiGLU's two inputs may each be one step away, which its three roundings carry on (at most
    four steps). Against the float32 computation the kernels are no farther than the modules."""
    B, K, N = 5, 72, 40
    x, scale, w, res = _inputs(B, K, 2 * N if mode == "swiglu" else N, jnp.bfloat16, seed=3)
    f = {"norm": lambda: norm_linear(x, scale, 1e-5, w, cols=16, k_step=32),
         "swiglu": lambda: norm_swiglu(x, scale, 1e-5, w, cols=16, k_step=32),
         "add": lambda: linear_add(x, w, res, cols=16, k_step=32)}[mode]
    assert f().dtype == jnp.bfloat16
    got = np.asarray(f().astype(jnp.float32))
    want = np.asarray(_want(mode, x, scale, w, res, 1e-5).astype(jnp.float32))
    steps = 4 if mode == "swiglu" else 1
    step = np.maximum(np.abs(want), 1e-2) * 2.0 ** -7
    assert np.all(np.abs(got - want) <= steps * step), np.abs(got - want).max()
    assert np.mean(got == want) > 0.9
    exact = np.asarray(_want(mode, *(a.astype(jnp.float32) for a in (x, scale, w, res)), 1e-5))
    assert rel_err(got, exact) <= 1.25 * rel_err(want, exact)


def test_bad_input_is_one_clear_error():
    x, scale, w, res = _inputs(2, 8, 16, jnp.float32)
    with pytest.raises(ValueError, match=r"^norm_linear: x \[B, K\] and a \[K, N\] weight"):
        norm_linear(x, scale, 1e-5, w.T)
    with pytest.raises(ValueError, match=r"^norm_linear: scale \[K=8\]"):
        norm_linear(x, scale[:4], 1e-5, w)
    with pytest.raises(ValueError, match=r"^norm_swiglu: scale \[K=8\] and w \[K, 2H\]"):
        norm_swiglu(x, scale, 1e-5, w[:, :15])
    with pytest.raises(ValueError, match=r"^linear_add: res \[B=2, N=16\]"):
        linear_add(x, w, res[:, :8])
    with pytest.raises(ValueError, match=r"^linear_add: cols must be a positive int"):
        linear_add(x, w, res, cols=0)
    with pytest.raises(ValueError, match=r"^norm_swiglu: unroll must be true or false"):
        norm_swiglu(x, scale, 1e-5, w, unroll=1)


def _lm(attention, layers):
    mcfg = ModelConfig(vocab_size=97, dim=40, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=48, attention=attention, init_std=0.3,
                       gate_bias=(0.5, -0.3, 0.2))
    return build_model(mcfg, NSAConfig(**SMALL), 0,
                       ExecConfig(decode_impl="reference", decode_layers=layers))


def _pallas_names(dec, tok):
    """Names of the Pallas kernels in one decode step's jaxpr."""
    model = nnx.merge(dec.step_graphdef.graphdef, dec.step_state)
    jaxpr = jax.make_jaxpr(lambda c, t: model.extend(t[:, None], c))(dec.cache, tok)
    return str(jaxpr)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_decoder_steps_equal_with_the_layers_in_xla_or_pallas(attention):
    """exec.decode_layers=pallas (interpret mode here) gives the steps' logits of the XLA layers
    for rows at different positions (dim 40, mlp_hidden 48: not powers of two), and its step
    runs the three kernels; xla runs none of them."""
    toks = jax.random.randint(jax.random.PRNGKey(4), (2, 32), 0, 97)
    lengths = [11, 18]
    decs = {}
    for layers in ("xla", "pallas"):
        decs[layers] = Decoder(_lm(attention, layers), 2, 32)
        decs[layers].prefill(toks[:, :18], lengths=lengths)
    step0 = toks[np.arange(2), np.asarray(lengths)]
    names = {k: _pallas_names(d, step0) for k, d in decs.items()}
    for n in ("nsa_decode_norm_linear", "nsa_decode_norm_swiglu", "nsa_decode_linear_add"):
        assert n in names["pallas"] and n not in names["xla"]
    for k in range(5):
        step = toks[np.arange(2), np.asarray(lengths) + k]
        got, want = (np.asarray(decs[i].step(step)) for i in ("pallas", "xla"))
        assert rel_err(got, want) <= 1e-5 and np.abs(got - want).max() <= 1e-5 * np.abs(
            want).max(), k


def test_decode_layers_auto_follows_decode_impl():
    assert fused_layers(ExecConfig(decode_impl="pallas"))
    assert not fused_layers(ExecConfig(decode_impl="reference"))
    assert fused_layers(ExecConfig(decode_impl="reference", decode_layers="pallas"))
    assert not fused_layers(ExecConfig(decode_impl="pallas", decode_layers="xla"))


@pytest.mark.gpu
@pytest.mark.parametrize("B,K,N", [(8, 768, 1572), (8, 768, 768), (64, 2048, 768)])
@pytest.mark.parametrize("mode", ["norm", "swiglu", "add"])
def test_gpu_kernels_bf16_match_xla(mode, B, K, N):
    """On the GPU, the 125M model's shapes: bf16 against XLA's bf16 (relative RMSE <= 5e-3)
    and against the float32 computation no farther than XLA's bf16 is."""
    n = 2 * N if mode == "swiglu" else N
    x, scale, w, res = _inputs(B, K, n, jnp.bfloat16, seed=5)
    f = {"norm": lambda: norm_linear(x, scale, 1e-5, w),
         "swiglu": lambda: norm_swiglu(x, scale, 1e-5, w),
         "add": lambda: linear_add(x, w, res)}[mode]
    got = np.asarray(jax.jit(f)().astype(jnp.float32))
    xla = np.asarray(jax.jit(lambda: _want(mode, x, scale, w, res, 1e-5))().astype(jnp.float32))
    f32 = [a.astype(jnp.float32) for a in (x, scale, w, res)]
    exact = np.asarray(_want(mode, *f32, 1e-5))
    assert rel_err(got, xla) <= 5e-3
    assert rel_err(got, exact) <= 1.5 * rel_err(xla, exact) + 1e-4
