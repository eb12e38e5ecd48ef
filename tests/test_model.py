"""The Flax NNX LM: φ, both attentions, causality of the full model, learning, bf16 path."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nsa_jax.config import ModelConfig
from nsa_jax.model import build_model, count_params, lm_loss
from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.compression import compress, compress_naive
from nsa_jax.nsa.rope import apply_rope
from nsa_testutil import rel_err

MCFG = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                   mlp_hidden=64)
NCFG = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=12)


@pytest.mark.parametrize("l,d,T", [(8, 4, 37), (8, 8, 40), (16, 4, 16), (32, 16, 100)])
def test_compress_matches_literal_eq7(l, d, T):
    cfg = NSAConfig(block_l=l, stride_d=d, sel_block=max(l, 2 * d), n_sel=3, window=8)
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    D, H = 6, 10
    x = jax.random.normal(ks[0], (2, T, 3, D))
    pos = jax.random.normal(ks[1], (l, D))
    w1, b1 = jax.random.normal(ks[2], (l * D, H)), jax.random.normal(ks[3], (H,))
    w2, b2 = jax.random.normal(ks[4], (H, 5)), jax.random.normal(ks[5], (5,))
    got = compress(x, pos, w1, b1, w2, b2, cfg)
    assert got.shape == (2, cfg.num_cmp_blocks(T), 3, 5)
    assert rel_err(got, compress_naive(x, pos, w1, b1, w2, b2, cfg)) < 1e-5


def test_rope_relative():
    """q(t)·k(s) after RoPE depends only on t - s."""
    q = jax.random.normal(jax.random.PRNGKey(1), (1, 1, 1, 8))
    k = jax.random.normal(jax.random.PRNGKey(2), (1, 1, 1, 8))
    dot = lambda t, s: float((apply_rope(q, jnp.array([t])) * apply_rope(k, jnp.array([s]))).sum())
    assert abs(dot(10, 3) - dot(107, 100)) < 1e-4
    assert abs(dot(10, 3) - dot(10, 4)) > 1e-3


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_model_runs_and_loss_near_uniform(attention):
    model = build_model(dataclasses.replace(MCFG, attention=attention), NCFG)
    toks = jax.random.randint(jax.random.PRNGKey(0), (2, 41), 0, 97)
    loss = float(nnx.jit(lm_loss)(model, toks))
    assert abs(loss - np.log(97)) < 0.3
    assert count_params(model) > 0


def test_nsa_module_has_separate_branch_kv_and_phi():
    model = build_model(MCFG, NCFG)
    attn = model.blocks[0].attn
    assert attn.wkv.kernel.shape == (32, 6 * 2 * 8)  # k, v for each of cmp, slc, win
    assert attn.wg.kernel.shape == (32, 4 * 3)      # one gate per head per branch
    assert attn.phi_k.pos_emb.shape == (8, 8) and attn.phi_v.pos_emb.shape == (8, 8)
    assert attn.phi_k.w1.shape == (8 * 8, 32)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_full_model_causality(attention):
    """d hidden[t] / d embedding-output[s] is exactly zero for s > t."""
    model = build_model(dataclasses.replace(MCFG, attention=attention), NCFG)
    T = 40
    x = jax.random.normal(jax.random.PRNGKey(3), (1, T, 32))
    pos = jnp.arange(T)

    @jax.jit
    def run(x):
        for blk in model.blocks:
            x = blk(x, pos)[0]
        return model.norm(x)

    _, vjp = jax.vjp(run, x)
    for t in (0, 9, 23, 31):
        (g,) = vjp(jnp.zeros((1, T, 32)).at[:, t].set(1.0))
        g = np.asarray(g)
        assert np.all(g[:, t + 1:] == 0.0), t
        assert np.abs(g[:, : t + 1]).sum() > 0


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_loss_falls_on_repeated_batch(attention):
    model = build_model(dataclasses.replace(MCFG, attention=attention), NCFG, seed=1)
    opt = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    toks = jax.random.randint(jax.random.PRNGKey(7), (4, 33), 0, 97)

    @nnx.jit
    def step(model, opt, toks):
        loss, grads = nnx.value_and_grad(lm_loss)(model, toks)
        opt.update(model, grads)
        return loss

    losses = [float(step(model, opt, toks)) for _ in range(40)]
    assert losses[-1] < 0.6 * losses[0], losses[::5]


def test_bf16_compute_path():
    m = dataclasses.replace(MCFG, compute_dtype="bfloat16")
    model = build_model(m, NCFG)
    assert model.blocks[0].attn.wq.kernel.dtype == jnp.float32  # params stay float32
    toks = jax.random.randint(jax.random.PRNGKey(0), (2, 41), 0, 97)
    h = nnx.jit(lambda mdl, t: mdl(t))(model, toks[:, :-1])
    assert h.dtype == jnp.bfloat16
    loss, grads = nnx.jit(nnx.value_and_grad(lm_loss))(model, toks)
    assert np.isfinite(float(loss)) and abs(float(loss) - np.log(97)) < 0.5
    leaves = jax.tree_util.tree_leaves(nnx.state(grads))
    assert all(leaf.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves)


def test_branch_ablation_in_model():
    model = build_model(MCFG, dataclasses.replace(NCFG, branches=("win",)))
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 20, 32))
    gates = model.blocks[0].attn.project(x, jnp.arange(20))[-1]
    assert np.all(np.asarray(gates[..., :2]) == 0) and np.all(np.asarray(gates[..., 2]) > 0)


def test_gate_bias_sets_each_heads_initial_gates():
    """model.gate_bias (cmp, slc, win) is every head's initial gate-logit bias: with zero gate
    weights the gates are exactly sigmoid(bias) for each head and branch, in that order."""
    m = dataclasses.replace(MCFG, gate_bias=(-3.0, 3.0, 0.5))
    model = build_model(m, NCFG)
    attn = model.blocks[0].attn
    np.testing.assert_array_equal(np.asarray(attn.wg.bias[...]),
                                  np.tile([-3.0, 3.0, 0.5], MCFG.n_heads).astype(np.float32))
    attn.wg.kernel[...] = jnp.zeros_like(attn.wg.kernel[...])
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 20, 32))
    gates = np.asarray(attn.project(x, jnp.arange(20))[-1], np.float32)      # [B,T,H,3]
    want = 1.0 / (1.0 + np.exp(-np.array([-3.0, 3.0, 0.5])))
    np.testing.assert_allclose(gates, np.broadcast_to(want, gates.shape), rtol=1e-6)
    default = build_model(MCFG, NCFG).blocks[0].attn.wg.bias[...]
    assert np.all(np.asarray(default) == 0.0)


def test_gate_bias_must_be_three_numbers():
    from nsa_jax.config import ConfigError, config_from_dict
    with pytest.raises(ConfigError, match=r"^model.gate_bias: must be 3 numbers \(cmp, slc, "
                                          r"win\), got \[1.0, 2.0\]"):
        config_from_dict({"model": {"gate_bias": [1, 2]}})
    with pytest.raises(ConfigError, match=r"^model.gate_bias\[1\]: must be a number"):
        config_from_dict({"model": {"gate_bias": [1, "x", 2]}})
    assert config_from_dict({"model": {"gate_bias": [0, 3, -3]}}).model.gate_bias == (0.0, 3.0,
                                                                                        -3.0)


@pytest.mark.parametrize("chunk", [7, 64])
def test_chunked_loss_equals_full_logits(chunk):
    """lm_loss (chunked, fused loss + gradient) == mean CE over full logits; same gradients:
    untied head with a padded last chunk (7), tied embeddings with a chunk longer than T (64).
    Chunk sizes and padding of the loss itself: tests/test_loss.py."""
    m = dataclasses.replace(MCFG, loss_chunk=chunk, tie_embeddings=chunk % 2 == 0)
    model = build_model(m, NCFG)
    toks = jax.random.randint(jax.random.PRNGKey(4), (2, 30), 0, 97)

    def full(model, toks):
        logits = model.logits(toks[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1:]).mean()

    l1, g1 = nnx.jit(nnx.value_and_grad(lm_loss))(model, toks)
    l2, g2 = nnx.jit(nnx.value_and_grad(full))(model, toks)
    assert abs(float(l1) - float(l2)) < 1e-5
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state(g1)), jax.tree_util.tree_leaves(nnx.state(g2))):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_packed_row_logits_equal_each_document_alone(attention):
    """segment_ids: every document of a packed row gets the logits it gets alone (positions
    restart per document; φ, selection and window stay inside it)."""
    model = build_model(dataclasses.replace(MCFG, attention=attention), NCFG)
    lengths = [1, 5, 16, 21, 13]       # 1, < l, = l', not a multiple of l', cut at the row end
    toks = jax.random.randint(jax.random.PRNGKey(7), (1, sum(lengths)), 0, 97)
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
    packed = nnx.jit(lambda m, t, s: m.logits(t, segment_ids=s))(model, toks, seg)
    run = nnx.jit(lambda m, t: m.logits(t))
    start = 0
    for L in lengths:
        alone = run(model, toks[:, start:start + L])
        assert rel_err(packed[:, start:start + L], alone) < 2e-5, (start, L)
        start += L
    # the loss ignores targets in the next document
    loss = nnx.jit(lambda m, t, s: lm_loss(m, t, segment_ids=s))(model, toks, seg)
    assert np.isfinite(float(loss))
