"""The decode step's dense parts as Pallas kernels (``pallas.decode_dense``): the kernels against
their jax.numpy twins, the twins against the model's modules, and a block's fused decode step
against its plain one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax import decode as kvcache
from nsa_jax.decode import Decoder, inference_state, step_state
from nsa_jax.model import Block, build_model
from nsa_jax.nsa import NSAConfig
from nsa_jax.pallas import decode_dense as dd
from nsa_jax.swiglu import swiglu
from nsa_testutil import rel_err

SMALL = dict(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)


def _arrays(M, K, N, dtype, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = (3.0 * jax.random.normal(ks[0], (M, K))).astype(dtype)
    scale = (1.0 + 0.3 * jax.random.normal(ks[1], (K,))).astype(dtype)
    w = (jax.random.normal(ks[2], (K, N)) / np.sqrt(K)).astype(dtype)
    res = jax.random.normal(ks[3], (M, N)).astype(dtype)
    return x, scale, w, res


# (M, K, N, bn, bk): rows, reduction and columns not multiples of the tiles, two row tiles (M=70)
SHAPES = [(1, 32, 140, None, None), (3, 40, 50, 16, 16), (8, 768, 96, None, None),
          (70, 48, 40, 16, 32)]


@pytest.mark.parametrize("M,K,N,bn,bk", SHAPES)
@pytest.mark.parametrize("glu", [False, True])
def test_norm_matmul_matches_its_twin_f32(M, K, N, bn, bk, glu):
    x, scale, w, _ = _arrays(M, K, 2 * N if glu else N, jnp.float32)
    got = dd.norm_matmul(x, scale, w, eps=1e-6, glu=glu, bn=bn, bk=bk)
    want = dd.norm_matmul_reference(x, scale, w, eps=1e-6, glu=glu)
    assert got.shape == want.shape == (M, N)
    assert rel_err(got, want) <= 2e-5, rel_err(got, want)


@pytest.mark.parametrize("M,K,N,bn,bk", SHAPES)
def test_matmul_add_matches_its_twin_f32(M, K, N, bn, bk):
    x, _, w, res = _arrays(M, K, N, jnp.float32, seed=1)
    got = dd.matmul_add(x, w, res, bn=bn, bk=bk)
    want = dd.matmul_add_reference(x, w, res)
    assert rel_err(got, want) <= 2e-5, rel_err(got, want)


def test_twins_are_the_modules_they_replace_bf16():
    """The twins round where the modules do: nnx.RMSNorm + nnx.Linear (bf16 compute dtype,
    float32 parameters), swiglu and the bf16 residual add. Up to one bf16 rounding step of the
    matmuls' float32 sums (XLA's dot on this CPU may sum in another order)."""
    bf = jnp.bfloat16
    K, N = 96, 80
    rngs = nnx.Rngs(0)
    norm = nnx.RMSNorm(K, epsilon=1e-6, dtype=bf, rngs=rngs)
    norm.scale[...] = 1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(5), (K,))
    lin = nnx.Linear(K, 2 * N, use_bias=False, dtype=bf, rngs=rngs)
    out = nnx.Linear(N, K, use_bias=False, dtype=bf, rngs=rngs)
    x = (3.0 * jax.random.normal(jax.random.PRNGKey(6), (4, K))).astype(bf)
    want = x + out(swiglu(lin(norm(x))))
    u = dd.norm_matmul_reference(x, norm.scale[...], lin.kernel[...].astype(bf), eps=1e-6,
                                 glu=True)
    got = dd.matmul_add_reference(u, out.kernel[...].astype(bf), x)
    assert got.dtype == want.dtype == bf
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2 ** -7, atol=2 ** -7 * float(jnp.abs(want).max()))


def test_bad_shapes_name_the_operand():
    x, scale, w, res = _arrays(2, 32, 40, jnp.float32)
    with pytest.raises(ValueError, match="scale"):
        dd.norm_matmul(x, scale[:8], w, eps=1e-6)
    with pytest.raises(ValueError, match="glu"):
        dd.norm_matmul(x, scale, w[:, :39], eps=1e-6, glu=True)
    with pytest.raises(ValueError, match="res"):
        dd.matmul_add(x, w, res[:, :8])


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_fused_block_step_equals_the_plain_step(attention):
    """Block.decode_step (the Pallas decode path: norms folded into the matmuls, SwiGLU and the
    residual adds in their epilogues) == Block.__call__'s step with the same attention kernels
    and caches, float32, on the decode-step weights (``step_state``); and it runs the kernels."""
    mcfg = ModelConfig(vocab_size=97, dim=40, n_layers=1, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=48, attention=attention, init_std=0.3,
                       gate_bias=(0.5, -0.3, 0.2))
    model = build_model(mcfg, NSAConfig(**SMALL), 0, ExecConfig(decode_impl="pallas"))
    dec = Decoder(model, 3, 40)
    toks = jax.random.randint(jax.random.PRNGKey(2), (3, 30), 0, 97)
    dec.prefill(toks[:, :20], lengths=[20, 7, 16])
    graph, state = step_state(model, inference_state(model)[1])
    blk = graph.merge(state).blocks[0]
    assert isinstance(blk, Block)
    x = jax.random.normal(jax.random.PRNGKey(3), (3, 1, 40))
    lc = kvcache.LayerCache(kv=dec.cache["layers"][0], pos=dec.cache["pos"],
                            n=jnp.ones((3,), jnp.int32))
    fused, fcache = blk.decode_step(x, lc)
    a, pcache = blk.attn(blk.norm1(x), lc.pos[:, None], lc)
    y = x + a
    plain = y + blk.mlp(blk.norm2(y))
    assert rel_err(fused, plain) <= 1e-5, rel_err(fused, plain)
    for p, q in zip(jax.tree.leaves(fcache.kv), jax.tree.leaves(pcache.kv)):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-5)
    text = str(jax.make_jaxpr(lambda x: blk.decode_step(x, lc)[0])(x))
    for k in ("nsa_decode_norm_matmul", "nsa_decode_norm_glu", "nsa_decode_matmul_add"):
        assert k in text, k


@pytest.mark.gpu
@pytest.mark.parametrize("M", [8, 64])
def test_gpu_kernels_bf16_match_their_f32_twins(M):
    """Compiled, bf16, the 125M model's matrices (dim 768, SwiGLU hidden 2048, the NSA step
    projection's 1572 columns): relative RMSE <= 5e-3 against the twins in float32 on the same
    (bf16-rounded) inputs."""
    x, scale, _, _ = _arrays(M, 768, 8, jnp.float32, seed=3)
    ks = jax.random.split(jax.random.PRNGKey(4), 3)
    wp = jax.random.normal(ks[0], (768, 1572)) / np.sqrt(768)
    wi = jax.random.normal(ks[1], (768, 4096)) / np.sqrt(768)
    wo = jax.random.normal(ks[2], (2048, 768)) / np.sqrt(2048)
    bf = jnp.bfloat16
    cases = [
        (lambda *a: dd.norm_matmul(*a, eps=1e-6), dd.norm_matmul_reference, (x, scale, wp)),
        (lambda *a: dd.norm_matmul(*a, eps=1e-6, glu=True),
         lambda *a, eps: dd.norm_matmul_reference(*a, eps=eps, glu=True), (x, scale, wi)),
    ]
    rounded = lambda args: [a.astype(bf).astype(jnp.float32) for a in args]
    for kern, twin, args in cases:     # the twins in float32 on the same bf16-rounded inputs
        got = jax.jit(kern)(*(a.astype(bf) for a in args))
        want = twin(*rounded(args), eps=1e-6)
        assert got.dtype == bf
        assert rel_err(got, want) <= 5e-3, rel_err(got, want)
    u = jax.random.normal(ks[0], (M, 2048))
    got = jax.jit(dd.matmul_add)(u.astype(bf), wo.astype(bf), x.astype(bf))
    assert rel_err(got, dd.matmul_add_reference(*rounded((u, wo, x)))) <= 5e-3
