"""Incremental decoding with NSA KV caches against the parallel forward and the reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.decode import DecodeError, Decoder, cache_sizes
from nsa_jax.nsa.reads import decode_reads, dense_reads
from nsa_jax.model import build_model
from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa import reference as ref
from nsa_jax.nsa import semantics
from nsa_jax.nsa.decoding import SYNC_SLOTS, nsa_decode_attention
from nsa_testutil import random_inputs, rel_err

SMALL = dict(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)


def _model(attention="nsa", seed=0, **nsa):
    # init_std 0.3 (not 0.02) makes the compressed softmax peaky enough that block scores differ
    # clearly, so the data-dependent top-n selection is exercised (not near-ties decided by
    # rounding).
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, attention=attention, init_std=0.3)
    return build_model(mcfg, NSAConfig(**{**SMALL, **nsa}), seed)


def _forward_logits(model, toks):
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s).logits(x))(state, toks))


def _decode_all(model, toks, P):
    """Logits [B,T,V] from prefill over toks[:, :P], then one decode step per remaining token."""
    B, T = toks.shape
    dec = Decoder(model, B, T)
    outs = [np.asarray(dec.prefill(toks[:, :P], all_logits=True))]
    for t in range(P, T):
        outs.append(np.asarray(dec.step(toks[:, t]))[:, None])
    return np.concatenate(outs, axis=1), dec


def _max_rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


# (attention, nsa overrides, T, prompt lengths): T and P are not multiples of d, l or l', and
# T > n*l' so that top-n really chooses among candidate blocks.
PARITY = [
    ("nsa", {}, 90, (1, 70)),
    ("nsa", dict(block_l=4, stride_d=4, sel_block=8, n_sel=3, window=5, n_init=0, n_local=1),
     61, (6,)),
    ("nsa", dict(branches=("slc", "win")), 75, (9,)),
    ("nsa", dict(branches=("cmp",)), 45, (3,)),
    ("dense", {}, 50, (1, 37)),
]


@pytest.mark.parametrize("attention,nsa,T,prompts", PARITY,
                         ids=["nsa", "nsa-l=d", "nsa-slc-win", "nsa-cmp", "dense"])
def test_prefill_then_decode_equals_full_forward(attention, nsa, T, prompts):
    model = _model(attention, **nsa)
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, T), 0, 97)
    want = _forward_logits(model, toks)
    for P in prompts:
        got, dec = _decode_all(model, toks, P)
        assert got.shape == want.shape
        assert _max_rel(got, want) <= 1e-4, (P, _max_rel(got, want))
        assert rel_err(got, want) <= 1e-4
    if attention == "nsa" and "cmp" in model.ncfg.branches:
        _check_cmp_cache(model, toks, dec.cache["layers"][0])


def _check_cmp_cache(model, toks, lc):
    """Compressed K/V emitted every d tokens equal φ + RoPE of the parallel path (layer 0)."""
    T = toks.shape[1]
    graphdef, state = nnx.split(model)

    @jax.jit
    def layer0_cmp(state, toks):
        m = nnx.merge(graphdef, state)
        blk = m.blocks[0]
        return blk.attn.project(blk.norm1(m.embed(toks)), jnp.arange(T))[1:3]

    k_cmp, v_cmp = layer0_cmp(state, toks)
    Tc = model.ncfg.num_cmp_blocks(T)
    assert Tc > 5 and k_cmp.shape[1] == Tc
    for got, want in ((lc["k_cmp"], k_cmp), (lc["v_cmp"], v_cmp)):
        np.testing.assert_allclose(np.swapaxes(np.asarray(got[:, :, :Tc]), 1, 2), want,
                                   rtol=1e-5, atol=1e-5)
        # nothing emitted past the last block (the cache's last slot is the decoder's scratch slot)
        assert not np.any(np.asarray(got[:, :, Tc:-1]))
        assert got.shape[2] - 1 >= model.ncfg.num_cmp_blocks(T)


def _caches_at(t, T, args, cfg):
    """Caches as the decoder holds them after tokens 0..t, with *future* tokens also written to
    the cmp and slc caches (they must be masked out)."""
    q, kc, vc, ks, vs, kw, vw, gates = (np.asarray(a) for a in args)
    sz = cache_sizes(cfg, T)
    B, _, G, D = ks.shape

    def full(x, S):
        out = np.zeros((B, G, S, x.shape[-1]), x.dtype)
        out[:, :, :x.shape[1]] = np.swapaxes(x, 1, 2)
        return out

    W = sz["win"]
    ring_k = np.full((B, G, W, D), 7.0, np.float32)  # garbage in never-written slots
    ring_v = np.full((B, G, W, vw.shape[-1]), -7.0, np.float32)
    for s in range(max(0, t + 1 - W), t + 1):
        ring_k[:, :, s % W] = kw[:, s]
        ring_v[:, :, s % W] = vw[:, s]
    return {"k_cmp": full(kc, sz["cmp"]), "v_cmp": full(vc, sz["cmp"]),
            "k_slc": full(ks, sz["slc"]), "v_slc": full(vs, sz["slc"]),
            "k_win": ring_k, "v_win": ring_v}


ATTN_CASES = [  # (l, d, l', n, w, n_init, n_local, B, T, G, h, branches)
    (8, 4, 16, 4, 16, 1, 2, 2, 75, 2, 2, ("cmp", "slc", "win")),
    (8, 8, 8, 2, 7, 0, 1, 1, 37, 1, 4, ("cmp", "slc", "win")),    # l == d == l', MQA
    (16, 4, 16, 4, 12, 2, 1, 1, 70, 3, 1, ("slc", "win")),        # r = l/d = 4, two init
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=[f"case{i}" for i in range(len(ATTN_CASES))])
def test_decode_attention_matches_reference_rows(case):
    l, d, lp, n, w, ni, nl, B, T, G, h, br = case
    cfg = NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=n, window=w, n_init=ni,
                    n_local=nl, branches=br)
    args = random_inputs(sum(case[:11]), B, T, G * h, G, 8, 6, cfg, scale=2.0)
    want = np.asarray(jax.jit(lambda *a: ref.nsa_attention_reference(*a, cfg))(*args))
    want_ids = np.asarray(jax.jit(lambda q, k: ref.select_blocks(q, k, cfg))(args[0], args[1]))
    f = jax.jit(lambda q, lc, t, g: nsa_decode_attention(q, lc, t, g, cfg, return_info=True))
    q, gates = np.asarray(args[0]), np.asarray(args[7])
    free_choices = set()   # non-forced selected blocks, over all t
    for t in range(T):
        out, info = f(q[:, t], _caches_at(t, T, args, cfg), jnp.int32(t), gates[:, t])
        assert rel_err(out, want[:, t]) < 1e-5, t
        np.testing.assert_array_equal(info["ids"], want_ids[:, t], err_msg=f"t={t}")
        cur = t // lp
        free_choices.add(tuple(j for j in np.asarray(info["ids"][0, 0])
                               if j >= 0 and not (j < ni or j > cur - nl)))
        reads = decode_reads(t, cfg)
        for b in ("cmp", "win"):
            if b in info and b in br:
                assert int(info[b]) == reads[b], (t, b)
        assert int(info["slc"]) <= reads["slc"]
        if (t + 1) <= n * lp or (t + 1) % lp == 0:
            assert int(info["slc"]) == reads["slc"], t
    if "slc" in br:   # the data-dependent part of the selection really varied
        assert len(free_choices) > 2, free_choices


def test_topn_per_position_matches_reference_with_ties():
    cfg = NSAConfig(block_l=4, stride_d=4, sel_block=8, n_sel=4, window=8, n_init=1, n_local=1)
    T = 70
    Ts = cfg.num_sel_blocks(T)
    # integer scores in {0, 1, 2}: many exact ties, which must go to the lower block index
    scores = jax.random.randint(jax.random.PRNGKey(3), (2, T, 3, Ts), 0, 3).astype(jnp.float32)
    want = np.asarray(ref.topn_from_scores(scores, cfg))
    rows = jax.jit(jax.vmap(lambda s, t: semantics.topn_from_scores(s, t, cfg), in_axes=(1, 0),
                            out_axes=1))
    np.testing.assert_array_equal(rows(scores, jnp.arange(T)), want)
    # larger cache than context: extra (non-candidate) blocks change nothing
    wide = jnp.concatenate([scores, jnp.full((2, T, 3, 5), 9.0)], axis=-1)
    np.testing.assert_array_equal(rows(wide, jnp.arange(T)), want)


def test_block_scores_equal_overlap_weights():
    rng = np.random.default_rng(0)
    for l, d, lp, T in [(32, 16, 64, 700), (8, 4, 16, 8), (8, 4, 16, 53), (4, 4, 8, 30),
                        (16, 4, 16, 77), (8, 8, 32, 100)]:
        cfg = NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=2, window=8, n_local=1)
        Tc, Ts = cfg.num_cmp_blocks(T), cfg.num_sel_blocks(T)
        p = rng.uniform(size=(2, 3, Tc)).astype(np.float32)
        want = p @ ref.overlap_weights(Tc, Ts, cfg)
        np.testing.assert_allclose(semantics.block_scores(p, Ts, cfg), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("N,nsa_total,dense_total",
                         [(8192, 2048, 8192), (16384, 2560, 16384), (32768, 3584, 32768),
                          (65536, 5632, 65536)])
def test_decode_reads_paper_table4(N, nsa_total, dense_total):
    cfg = NSAConfig()   # l=32, d=16, l'=64, n=16, w=512
    paper = decode_reads(N - 1, cfg, convention="paper")
    assert paper["total"] == nsa_total
    assert (paper["cmp"], paper["slc"], paper["win"]) == (N // 16, 1024, 512)
    exact = decode_reads(N - 1, cfg)
    # exact counts complete blocks only: l/d - 1 = 1 trailing block fewer than N/d
    assert exact["cmp"] == (N - 32) // 16 + 1 == N // 16 - 1
    assert exact["total"] == nsa_total - 1
    assert dense_reads(N - 1) == dense_total


def test_decode_reads_small_contexts_and_ablation():
    cfg = NSAConfig(**SMALL)
    assert decode_reads(0, cfg) == {"cmp": 0, "slc": 1, "win": 1, "total": 2}
    assert decode_reads(6, cfg)["cmp"] == 0 and decode_reads(7, cfg)["cmp"] == 1
    assert decode_reads(11, cfg)["cmp"] == 2 and decode_reads(30, cfg)["win"] == 16
    assert decode_reads(100, cfg)["slc"] == 64
    ab = decode_reads(100, NSAConfig(**SMALL, branches=("win",)))
    assert ab == {"cmp": 0, "slc": 0, "win": 16, "total": 16}
    with pytest.raises(ValueError, match="convention"):
        decode_reads(3, cfg, convention="table")


def test_decoder_errors_are_clear():
    model = _model("dense")
    dec = Decoder(model, 1, 6)
    with pytest.raises(DecodeError, match="prefill"):
        dec.step([1])
    with pytest.raises(DecodeError, match="max_len=6"):
        dec.prefill(jnp.ones((1, 7), jnp.int32))
    with pytest.raises(DecodeError, match="batch=1"):
        dec.prefill(jnp.ones((2, 3), jnp.int32))
    dec.prefill(jnp.ones((1, 5), jnp.int32))
    dec.step([2])
    with pytest.raises(DecodeError, match="cache full"):
        dec.step([3])


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_gpu_decode_matches_forward_with_pallas_prefill(attention):
    """On the GPU: the prompt goes through the Pallas kernels (float32, IEEE dots), decoding
    through the pure-JAX step; both must agree with the full Pallas forward."""
    mcfg = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, n_kv_groups=2,
                       head_dim=32, mlp_hidden=256, attention=attention, init_std=0.3)
    model = build_model(mcfg, NSAConfig(block_l=32, stride_d=16, sel_block=64, n_sel=4,
                                        window=64), 0, ExecConfig(nsa_impl="pallas"))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 300), 0, 256)
    want = _forward_logits(model, toks)
    got, _ = _decode_all(model, toks, 77)
    assert _max_rel(got, want) <= 1e-4 and rel_err(got, want) <= 1e-4


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_rows_at_different_positions(attention):
    """Prompts of different lengths in one batch (right-padded with junk): every row's logits,
    at prefill and at each later step, equal the full forward of that row alone. Row lengths
    straddle compressed-block emission (l=8, d=4), selection blocks (l'=16) and the window (16)."""
    model = _model(attention)
    T, lengths = 60, [5, 23, 16]
    toks = jax.random.randint(jax.random.PRNGKey(2), (3, T), 0, 97)
    want = _forward_logits(model, toks)
    P = max(lengths)
    junk = jax.random.randint(jax.random.PRNGKey(9), (3, P), 0, 97)
    prompt = jnp.where(jnp.arange(P) < jnp.asarray(lengths)[:, None], toks[:, :P], junk)
    dec = Decoder(model, 3, T)
    got = np.asarray(dec.prefill(prompt, lengths=lengths))
    rows = np.arange(3)
    np.testing.assert_allclose(got, want[rows, np.asarray(lengths) - 1], rtol=0, atol=1e-4)
    for k in range(T - P):
        pos = np.asarray(lengths) + k
        got = np.asarray(dec.step(toks[rows, pos]))
        assert _max_rel(got, want[rows, pos]) <= 1e-4, k


def _sample_then_step(dec, logits, key, k, **kw):
    """The per-token host loop: k x (split the key, sample, Decoder.step)."""
    from nsa_jax.sampling import sample

    ids = []
    for _ in range(k):
        key, sub = jax.random.split(key)
        t = sample(logits, sub, **kw)
        ids.append(np.asarray(t))
        logits = dec.step(t)
    return np.stack(ids, 1), logits, key


@pytest.mark.parametrize("attention", ["nsa", "dense"])
@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0, top_k=20)],
                         ids=["greedy", "top_k"])
def test_decode_loop_equals_sample_then_step(attention, kw):
    """Decoder.decode (k steps in one jitted call, here 2 calls of 4) gives the ids, final
    logits, key, done flags and positions of 8 host iterations of sample + Decoder.step, for
    rows at different prompt lengths (5, 23, 16). On the CPU the scan-compiled step gives the
    same logits bit for bit. (The last call of a generation, ``feed_last=False``, is checked
    through generate_batch in tests/test_generate.py.)"""
    model = _model(attention)
    lengths = [5, 23, 16]
    toks = jax.random.randint(jax.random.PRNGKey(2), (3, max(lengths)), 0, 97)
    a, b = Decoder(model, 3, 40), Decoder(model, 3, 40)
    la, lb = a.prefill(toks, lengths), b.prefill(toks, lengths)
    want, la, key_a = _sample_then_step(a, la, jax.random.PRNGKey(3), 8, **kw)
    eos = int(want[1, 2])                       # row 1 samples it at step 2 (of 8)
    done_a = (want == eos).any(axis=1)
    ids1, lb, key_b, done_b = b.decode(lb, 4, jax.random.PRNGKey(3), eos_id=eos, **kw)
    ids2, lb, key_b, done_b = b.decode(lb, 4, key_b, eos_id=eos, done=done_b, **kw)
    got = np.concatenate([np.asarray(ids1), np.asarray(ids2)], axis=1)
    np.testing.assert_array_equal(got, want)
    assert len(set(want.ravel().tolist())) > 3          # not a constant stream
    np.testing.assert_array_equal(np.asarray(lb), np.asarray(la))
    np.testing.assert_array_equal(np.asarray(key_b), np.asarray(key_a))
    np.testing.assert_array_equal(np.asarray(done_b), done_a)
    assert done_a[1] and not done_a.all()
    assert b.steps == a.steps == 8 and b.pos == a.pos == 23 + 8


def test_decode_loop_checks_the_cache():
    """decode needs a prefill and pos + steps <= max_len (pos + steps - 1 when the last ids are
    not fed); a refused call changes nothing."""
    model = _model("dense")
    dec = Decoder(model, 2, 10)
    key = jax.random.PRNGKey(0)
    with pytest.raises(DecodeError, match="prefill"):
        dec.decode(jnp.zeros((2, 97)), 2, key)
    logits = dec.prefill(jnp.ones((2, 6), jnp.int32), lengths=[6, 3])
    with pytest.raises(DecodeError, match="steps must be >= 1, got 0"):
        dec.decode(logits, 0, key)
    with pytest.raises(DecodeError, match=r"batch=2"):
        dec.decode(logits[:1], 2, key)
    with pytest.raises(DecodeError, match=r"steps=5 .* position 6 .* 4 slot\(s\) left .*"
                                          r"max_len=10"):
        dec.decode(logits, 5, key)
    assert dec.steps == 0
    ids, logits, key, _ = dec.decode(logits, 3, key, temperature=0)
    assert ids.shape == (2, 3) and dec.pos == 9
    with pytest.raises(DecodeError, match="max_len=10"):
        dec.decode(logits, 2, key, temperature=0)
    ids, _, _, _ = dec.decode(logits, 2, key, temperature=0, feed_last=False)
    assert ids.shape == (2, 2) and dec.pos == 10
    with pytest.raises(DecodeError, match="cache full"):
        dec.step([1, 2])


def test_bf16_inference_weights_change_nothing():
    """The decoder casts float32 parameters to the bf16 compute dtype once; every parameter is
    cast at its use anyway, so the logits are bit-identical to the model's own forward."""
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, init_std=0.3, compute_dtype="bfloat16")
    model = build_model(mcfg, NSAConfig(**SMALL), 0)
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 40), 0, 97)
    want = _forward_logits(model, toks)
    dec = Decoder(model, 2, 40)
    for path, x in jax.tree_util.tree_leaves_with_path(dec.state):   # only φ stays float32
        want_dt = jnp.float32 if "phi_" in jax.tree_util.keystr(path) else jnp.bfloat16
        assert x.dtype == want_dt, jax.tree_util.keystr(path)
    got = np.asarray(dec.prefill(toks, all_logits=True))
    np.testing.assert_array_equal(got, want)


def test_step_state_casts_phi_and_changes_no_step():
    """The decode steps run with φ's matrices and biases in bf16 (cast once, not per step; its
    position embedding stays float32): the step's logits are bit-identical to a step with the
    float32 φ of the prefill state, over an emission (t = 39 ends a compressed block). This is
    the XLA decode path (CPU); the Pallas path casts in its kernels the same way."""
    from nsa_jax.decode import step_jit
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, init_std=0.3, compute_dtype="bfloat16")
    model = build_model(mcfg, NSAConfig(**SMALL), 0)
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 44), 0, 97)
    dec = Decoder(model, 2, 44)
    for path, x in jax.tree_util.tree_leaves_with_path(dec.step_state):
        name = jax.tree_util.keystr(path)
        want_dt = jnp.float32 if "phi_" in name and "pos_emb" in name else jnp.bfloat16
        assert x.dtype == want_dt, name
    dec.prefill(toks[:, :36])
    for t in range(36, 44):
        cache = jax.tree.map(jnp.copy, dec.cache)
        want = np.asarray(step_jit(dec.graphdef, dec.state, cache, toks[:, t])[0])
        np.testing.assert_array_equal(np.asarray(dec.step(toks[:, t])), want, err_msg=f"t={t}")


def test_static_graph_is_hashed_once_and_shares_the_jit_cache(monkeypatch):
    """The steps' GraphDef goes to jit as ``decode_loop.StaticGraph``: its hash is computed once
    (nnx walks the whole graph per hash, on every jitted call otherwise), one instance serves
    every Decoder of a graph, two wrappers of one graph (and one state structure) are equal and
    hit one jit cache entry, and the flat state gives the structured state's logits bitwise."""
    from flax.nnx import graphlib

    from nsa_jax.decode import inference_state, step_jit, step_state
    from nsa_jax.decode_loop import StaticGraph, flat_state
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, init_std=0.3)
    model = build_model(mcfg, NSAConfig(**SMALL), 0)
    gd, st = step_state(model, inference_state(model)[1])
    assert isinstance(gd, StaticGraph)
    g1, leaves = flat_state(gd, st)
    g2, _ = flat_state(gd, st)
    assert g1 is g2 and g1 != gd                    # one instance per graph (StaticGraph.of)
    g3 = StaticGraph(gd.graphdef, g1.treedef)       # an equal wrapper, not the interned one
    assert g3 == g1 and hash(g3) == hash(g1) and g3 is not g1
    assert step_state(model, inference_state(model)[1])[0] is gd
    np.testing.assert_array_equal(gd.merge(st).blocks[0].attn.w_step[...],
                                  g1.merge(leaves).blocks[0].attn.w_step[...])
    assert isinstance(leaves, list) and all(isinstance(x, jax.Array) for x in leaves)
    dec = Decoder(model, 2, 16)
    dec.prefill(jnp.ones((2, 5), jnp.int32))
    calls = []
    orig = graphlib.GraphDef.__hash__
    monkeypatch.setattr(graphlib.GraphDef, "__hash__", lambda self: calls.append(1) or orig(self))
    tok = jnp.ones((2,), jnp.int32)
    before = step_jit._cache_size()
    a = step_jit(g1, leaves, jax.tree.map(jnp.copy, dec.cache), tok)[0]
    b = step_jit(g3, leaves, jax.tree.map(jnp.copy, dec.cache), tok)[0]
    c = step_jit(gd, st, jax.tree.map(jnp.copy, dec.cache), tok)[0]
    assert step_jit._cache_size() - before <= 2     # g1 and g3 share one entry
    assert not calls, "a GraphDef was hashed on a jitted call"
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


PALLAS_CASES = ATTN_CASES + [   # window over 3 programs of 16 slots; 3 key splits, one empty
    (8, 4, 16, 4, 40, 1, 2, 1, 80, 2, 3, ("cmp", "slc", "win")),
    (8, 4, 16, 4, 24, 1, 2, 1, 50, 2, 2, ("cmp", "win")),          # no selection branch
]


@pytest.mark.parametrize("case", PALLAS_CASES, ids=[f"case{i}" for i in range(len(PALLAS_CASES))])
def test_pallas_decode_kernel_matches_jnp_decode(case):
    """Pallas decode kernels (interpret mode) == the jax.numpy decode path, float32, for every
    position of a sequence (before and after compressed blocks are emitted, t < l, t < l', the
    window wrapping) with batch rows at *different* positions (row b at t - b)."""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    l, d, lp, n, w, ni, nl, B, T, G, h, br = case
    cfg = NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=n, window=w, n_init=ni,
                    n_local=nl, branches=br)
    B = 2
    args = random_inputs(sum(case[:11]) + 1, B, T, G * h, G, 8, 6, cfg, scale=2.0)
    q, gates = np.asarray(args[0]), np.asarray(args[7])
    want_f = jax.jit(lambda q, lc, t, g: nsa_decode_attention(q, lc, t, g, cfg))
    # small tiles so the compressed keys span several tiles and key splits and the selection
    # blocks several scoring chunks (the default tiles cover these short contexts in one); 1, 2
    # or 3 selected blocks / window tiles per program over the cases
    per = (1, 2, 3, 2, 1)[PALLAS_CASES.index(case)]  # case 3: 2 x 2 tiles of its 3-tile window
    got_f = jax.jit(lambda q, lc, t, g: nsa_decode_pallas(q, lc, t, g, cfg, cmp_keys=16,
                                                          win_keys=16, splits=3,
                                                          sel_chunk=4, slc_per=per))
    for t in range(1, T, 3):
        ts = np.array([t, t - 1])
        lcs = [_caches_at(int(tt), T, args, cfg) for tt in ts]
        lc = {k: np.stack([lcs[b][k][b] for b in range(B)]) for k in lcs[0]}
        qb = q[np.arange(B), ts]
        gb = gates[np.arange(B), ts]
        want = want_f(qb, lc, jnp.asarray(ts), gb)
        got = got_f(qb, lc, jnp.asarray(ts), gb)
        assert rel_err(got, want) <= 2e-5, (t, rel_err(got, want))


def test_pallas_decode_window_ring_longer_than_window():
    """A window ring of W = 40 slots for a window of w = 20 (``k_win`` may hold more than w
    positions; the decoder allocates min(w, max_len) slots, where every slot it holds is inside
    the window, so no other test sees the kernel's ``pos > t - w`` rule): the Pallas decode
    kernels attend to t - w < s <= t only, as the jax.numpy decode path, not to the older
    positions still in the ring. Float32, interpret mode, rows at different positions before
    and after the ring wraps, the ring over 3 window tiles of 16 slots (the last partial)."""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=20, branches=("win",))
    B, G, h, D, W = 2, 2, 3, 16, 40
    ks = jax.random.split(jax.random.PRNGKey(8), 4)
    kv = {"k_win": jax.random.normal(ks[0], (B, G, W, D)),
          "v_win": jax.random.normal(ks[1], (B, G, W, D))}
    gates = jax.nn.sigmoid(jax.random.normal(ks[2], (B, G * h, 3)))
    want_f = jax.jit(lambda q, t: nsa_decode_attention(q, kv, t, gates, cfg))
    got_f = jax.jit(lambda q, t: nsa_decode_pallas(q, kv, t, gates, cfg, win_keys=16))
    for i, t0 in enumerate([21, 39, 57, 100]):
        t = jnp.asarray([t0, t0 - 3], jnp.int32)
        q = 2.0 * jax.random.normal(jax.random.fold_in(ks[3], i), (B, G * h, D))
        assert rel_err(got_f(q, t), want_f(q, t)) <= 2e-5, t0


@pytest.mark.gpu
@pytest.mark.parametrize("B,S,positions", [
    (4, 4096, [(0, 30, 31, 63), (64, 511, 512, 1023), (2047, 4000, 4094, 4095)]),
    # 128k, one row: 128 splits of one tile each (decode._splits), some past the row's position
    (1, 131072, [(131071,), (131055,), (70000,), (1000,)])])
def test_gpu_pallas_decode_bf16_matches_jnp_decode(B, S, positions):
    """Compiled Pallas decode kernels, bf16 caches at the 125M shape (h=6, D=64, paper NSA
    defaults), rows at positions around emissions and block edges: relative RMSE <= 5e-3
    against the jax.numpy decode path on the same caches."""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    cfg = NSAConfig()
    G, h, D = 2, 6, 64
    ks = jax.random.split(jax.random.PRNGKey(0), 9)
    Tc = cfg.num_cmp_blocks(S)
    bf = jnp.bfloat16
    kv = {"k_cmp": jax.random.normal(ks[0], (B, G, Tc, D), bf),
          "v_cmp": jax.random.normal(ks[1], (B, G, Tc, D), bf),
          "k_slc": jax.random.normal(ks[2], (B, G, S, D), bf),
          "v_slc": jax.random.normal(ks[3], (B, G, S, D), bf),
          "k_win": jax.random.normal(ks[4], (B, G, cfg.window, D), bf),
          "v_win": jax.random.normal(ks[5], (B, G, cfg.window, D), bf)}
    gates = jax.nn.sigmoid(jax.random.normal(ks[6], (B, G * h, 3))).astype(bf)
    f_ref = jax.jit(lambda q, t: nsa_decode_attention(q, kv, t, gates, cfg))
    f_pal = jax.jit(lambda q, t: nsa_decode_pallas(q, kv, t, gates, cfg))
    for i, ts in enumerate(positions):
        q = (2.0 * jax.random.normal(jax.random.fold_in(ks[7], i), (B, G * h, D))).astype(bf)
        t = jnp.asarray(ts, jnp.int32)
        want = np.asarray(f_ref(q, t), np.float32)
        got = np.asarray(f_pal(q, t), np.float32)
        assert rel_err(got, want) <= 5e-3, (ts, rel_err(got, want))


def test_compress_block_equals_compress():
    """The decoder's one-block φ (Eq. 7 as written) == the training path's chunked φ."""
    from nsa_jax.nsa.compression import compress, compress_block
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    x = jax.random.normal(ks[0], (3, 8, 2, 16))
    p = (jax.random.normal(ks[1], (8, 16)) * 0.3, jax.random.normal(ks[2], (128, 32)) * 0.1,
         jax.random.normal(ks[3], (32,)), jax.random.normal(ks[4], (32, 16)) * 0.2,
         jax.random.normal(ks[5], (16,)))
    np.testing.assert_allclose(compress_block(jnp.swapaxes(x, 1, 2), *p), compress(x, *p, cfg),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_pallas_decode_path_with_fused_cache_writes_matches_reference(attention):
    """exec.decode_impl=pallas (interpret mode here): the decode kernels, the cache writes and the
    token's RoPE in one Pallas kernel per layer (``pallas.cache_write``) and φ's emission in
    ``pallas.phi_decode`` give the reference decoder's logits for
    rows at different positions, steps across compressed-block emissions and the window wrap,
    and the same caches (up to the decode attention's float rounding feeding later layers), but
    for the compressed caches' scratch slot: the kernel skips the rows no block ends at, XLA
    writes their φ there; no position reads it."""
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, attention=attention, init_std=0.3,
                       gate_bias=(0.5, -0.3, 0.2))   # the fused step projection adds it itself
    models = {i: build_model(mcfg, NSAConfig(**SMALL), 0, ExecConfig(decode_impl=i))
              for i in ("reference", "pallas")}
    toks = jax.random.randint(jax.random.PRNGKey(4), (2, 32), 0, 97)
    lengths = [11, 18]   # then positions 11..16 (window of 16 wraps) and 18..23 (emissions)
    decs = {i: Decoder(m, 2, 32) for i, m in models.items()}
    for dec in decs.values():
        dec.prefill(toks[:, :18], lengths=lengths)
    for k in range(6):
        step = toks[np.arange(2), np.asarray(lengths) + k]
        got, want = (np.asarray(decs[i].step(step)) for i in ("pallas", "reference"))
        assert _max_rel(got, want) <= 1e-5, k
    got, want = (jax.tree_util.tree_leaves_with_path(decs[i].cache) for i in ("pallas", "reference"))
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
        if jax.tree_util.keystr(path).endswith(("['k_cmp']", "['v_cmp']")):
            a, b = a[:, :, :-1], b[:, :, :-1]          # the scratch slot
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_dense_pallas_step_gets_the_nsa_step_treatment(monkeypatch):
    """The dense model's Pallas decode step projects with one fused matrix (``w_step``) and rotates
    q and the key in the cache-write kernel, as NSA's does (``cache_update.append_dense_rows``,
    traced once per layer); the reference path keeps the XLA projection and rotation. (Their
    values agree: ``test_pallas_decode_path_with_fused_cache_writes_matches_reference``.)"""
    from nsa_jax import cache_update
    calls = []
    real = cache_update.append_dense_rows
    monkeypatch.setattr(cache_update, "append_dense_rows",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, attention="dense", init_std=0.3)
    toks = jax.random.randint(jax.random.PRNGKey(4), (2, 12), 0, 97)
    for impl, want in (("pallas", 2), ("reference", 0)):
        calls.clear()
        dec = Decoder(build_model(mcfg, NSAConfig(**SMALL), 0, ExecConfig(decode_impl=impl)), 2, 16)
        dec.prefill(toks[:, :8])
        dec.step(toks[:, 8])
        assert len(calls) == want, impl
        assert dec.step_graphdef.merge(dec.step_state).blocks[0].attn.w_step[...].shape == (32, 64)


@pytest.mark.parametrize("dtype,fused", [("float32", False), ("bfloat16", False),
                                         ("float32", True), ("bfloat16", True)])
def test_phi_emission_kernel_matches_compress_block(dtype, fused, monkeypatch):
    """``pallas.phi_decode`` (interpret mode): φ_K + RoPE and φ_V of each row's block written at
    its index == the layer's ``compress_block`` + the XLA write, for rows at different offsets,
    11 rows x 2 groups in 16-pair tiles (the second partial). Rows bound for the scratch slot (the
    caches' last: no block ends at their position) are skipped, every row of the second tile
    among them; nothing else in the caches changes, the scratch slot included. float32: within
    float rounding. bf16: the kernel and XLA round at different points, so both are held to the
    float32 computation: the kernel's relative RMSE <= 1e-2 and no more than 1.5x XLA's own bf16
    error. ``fused``: one launch (the output layer in each row tile's completing program, with
    the cache's completion counters ``sync``, which must come back 0)."""
    import functools

    from nsa_jax.pallas import phi_decode
    monkeypatch.setattr(phi_decode, "emit_pallas", functools.partial(phi_decode.emit_pallas,
                                                                     rows=16))
    kw = dict(vocab_size=97, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, head_dim=8,
              mlp_hidden=64, init_std=0.3)
    attn = build_model(ModelConfig(**kw, compute_dtype=dtype), NSAConfig(**SMALL), 0).blocks[0].attn
    attn32 = build_model(ModelConfig(**kw), NSAConfig(**SMALL), 0).blocks[0].attn
    dt = jnp.dtype(dtype)
    B, G, l, D, Tc = 11, 2, 8, 8, 12
    ks = jax.random.split(jax.random.PRNGKey(5), 4)
    kb, vb = (jax.random.normal(k, (B, G, l, D)).astype(dt) for k in ks[:2])
    kc, vc = (jax.random.normal(k, (B, G, Tc, D)).astype(dt) for k in ks[2:])
    off = 4 * jnp.arange(B)
    r = np.arange(B)
    idx = np.where((r % 3 == 0) | (r >= 8), Tc - 1, r % (Tc - 1))
    emits = idx != Tc - 1
    be, ie = r[emits], idx[emits]
    sync = jnp.zeros((B, G, SYNC_SLOTS), jnp.int32) if fused else None
    got = jax.jit(lambda *a: attn.emit_block(*a, interpret=True, sync=sync))(
        kc, vc, kb, vb, off, jnp.asarray(idx))
    if fused:
        got, sync = got[:2], got[2]
        assert not np.asarray(sync).any(), np.asarray(sync)
    xla = jax.jit(attn.compress_block)(kb, vb, off)
    f32 = jax.jit(attn32.compress_block)(kb.astype(jnp.float32), vb.astype(jnp.float32), off)
    for cache, g_, x_, r_ in zip((kc, vc), got, xla, f32):
        assert g_.dtype == dt
        g_, cache = np.asarray(g_), np.asarray(cache)
        untouched = np.ones(g_.shape, bool)
        untouched[be, :, ie] = False
        np.testing.assert_array_equal(g_[untouched], cache[untouched])
        e_got = rel_err(g_[be, :, ie].astype(np.float32), r_[be, 0])
        if dtype == "float32":
            want = cache.copy()
            want[be, :, ie] = np.asarray(x_)[be, 0]
            np.testing.assert_allclose(g_, want, rtol=1e-5, atol=1e-5)
        else:
            e_xla = rel_err(np.asarray(x_[be, 0], np.float32), r_[be, 0])
            assert e_got <= 1e-2 and e_got <= 1.5 * e_xla, (e_got, e_xla)


def test_cache_write_kernel_is_the_xla_scatters_bitwise():
    """``write_rows_pallas`` (interpret mode) == ``write_rows`` per cache bitwise, and its ring
    readout == the ring gathered in token order after the write; rows at different positions, a
    ring that wraps, a block start before 0, head dim not a power of two; rows given as one
    stack, or q and the stack as ``Columns`` of one wider array. Keys (with and without queries)
    and queries rotated in the kernel == ``apply_rope`` then the writes, within float rounding; a
    rotated ring cache and a stack of the wrong shape are refused."""
    from nsa_jax.nsa.decoding import gather_rows, write_rows
    from nsa_jax.pallas.cache_write import write_rows_pallas
    rng = np.random.default_rng(0)
    B, G, D, S, W, L = 3, 2, 12, 40, 16, 8
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    bufs = (f(B, G, S, D), f(B, G, S, D), f(B, G, W, D), f(B, G, W, D), f(B, G, L, D),
            f(B, G, L, D))
    rows = tuple(f(B, G, D) for _ in range(6))
    t = jnp.asarray([5, 17, 39], jnp.int32)
    idx = (t, t, t % W, t % W, t % L, t % L)
    start = t - (L - 1)
    got = jax.jit(lambda b, r: write_rows_pallas(b, r, idx, ring=(4, 5), ring_start=start,
                                                 interpret=True))(bufs, rows)
    want = [write_rows(b, r, i) for b, r, i in zip(bufs, rows, idx)]
    for a, w in zip(got[:6], want):
        np.testing.assert_array_equal(a, w)
    slots = jnp.mod(start[:, None] + jnp.arange(L), L)
    for a, w in zip(got[6:], want[4:]):
        np.testing.assert_array_equal(a, gather_rows(w, slots))
    # the rows as one [B,R,G,D] stack with a pick per cache (the decode step's form)
    stack = jnp.stack([rows[i] for i in (4, 5, 0, 1, 2, 3)], axis=1)       # ROWS order
    picks = (2, 3, 4, 5, 0, 1)
    got2 = jax.jit(lambda b, r: write_rows_pallas(b, (r, picks), idx, ring=(4, 5),
                                                  ring_start=start, interpret=True))(bufs, stack)
    for a, w in zip(got2, got):
        np.testing.assert_array_equal(a, w)
    # RoPE in the kernel: rows of caches 0 and 2 (the keys) and the queries rotated at t
    from nsa_jax.nsa.rope import apply_rope, cos_sin
    cos, sin = cos_sin(t, D)
    q = f(B, 3 * G, D)
    got3 = jax.jit(lambda b, r, q: write_rows_pallas(
        b, (r, picks), idx, ring=(4, 5), ring_start=start, interpret=True,
        rope=(cos, sin, (0, 2)), q=q))(bufs, stack, q)
    rot = lambda x: apply_rope(x[:, None], t[:, None])[:, 0]      # [B,H,D] at t
    want3 = [write_rows(b, rot(r) if i in (0, 2) else r, j)
             for i, (b, r, j) in enumerate(zip(bufs, rows, idx))]
    for a, w in zip(got3[:6], want3):
        np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6)
    for a, w in zip(got3[6:8], got[6:]):                           # ring readout: un-rotated
        np.testing.assert_array_equal(a, w)
    np.testing.assert_allclose(got3[8], rot(q), rtol=1e-6, atol=1e-6)
    got4 = jax.jit(lambda b, r: write_rows_pallas(                  # keys only, no queries
        b, (r, picks), idx, ring=(4, 5), ring_start=start, interpret=True,
        rope=(cos, sin, (0, 2))))(bufs, stack)
    assert len(got4) == 8
    for a, w in zip(got4, got3[:8]):
        np.testing.assert_array_equal(a, w)
    # q and the stack as Columns of one [B, W] array (the fused step projection's form)
    from nsa_jax.pallas.cache_write import Columns
    P = jnp.concatenate([f(B, 5), q.reshape(B, -1), stack.reshape(B, -1), f(B, 7)], axis=1)
    nq = 3 * G * D
    got5 = jax.jit(lambda b, P: write_rows_pallas(
        b, (Columns(P, 5 + nq, (6, G, D)), picks), idx, ring=(4, 5), ring_start=start,
        interpret=True, rope=(cos, sin, (0, 2)), q=Columns(P, 5, (3 * G, D))))(bufs, P)
    for a, w in zip(got5, got3):
        np.testing.assert_array_equal(a, w)
    with pytest.raises(ValueError, match="stack matching the caches"):
        write_rows_pallas(bufs, (Columns(P, 5, (6, G, D + 1)), picks), idx, interpret=True)
    with pytest.raises(ValueError, match="ring"):
        write_rows_pallas(bufs, (stack, picks), idx, ring=(4, 5), ring_start=start,
                          rope=(cos, sin, (4,)), interpret=True)


def test_gate_logits_in_the_finishing_kernel_match_the_model_gates():
    """``GateLogits`` (logits as Columns of a wider array + bias; the sigmoid in the finishing
    kernel) == the gate values the model forms, passed as values, to float rounding; in bf16
    (bias added in bf16, sigmoid in float32, rounded to bf16) XLA's excess precision may skip
    rounding the bf16 sum before the sigmoid, so the values are formed both ways and one must
    match. A logits width or bias that does not match 3Hq, or columns past the array, are
    refused."""
    from nsa_jax.pallas.cache_write import Columns
    from nsa_jax.pallas.decode import GateLogits, nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)
    B, G, h, D, S = 2, 2, 3, 16, 96
    ks = jax.random.split(jax.random.PRNGKey(7), 9)
    Tc = cfg.num_cmp_blocks(S)
    t = jnp.asarray([70, 41], jnp.int32)
    for dt in (jnp.float32, jnp.bfloat16):
        kv = {n: jax.random.normal(k, (B, G, L, D), dt) for k, (n, L) in zip(ks, [
            ("k_cmp", Tc), ("v_cmp", Tc), ("k_slc", S), ("v_slc", S), ("k_win", 16),
            ("v_win", 16)])}
        q = jax.random.normal(ks[6], (B, G * h, D), dt)
        P = (2 * jax.random.normal(ks[7], (B, 5 + 3 * G * h))).astype(dt)
        bias = (0.5 * jax.random.normal(ks[8], (3 * G * h,))).astype(dt)
        f32 = lambda x: x.astype(jnp.float32)
        gl = GateLogits(Columns(P, 5, (3 * G * h,)), bias, dt)
        got = jax.jit(lambda: nsa_decode_pallas(q, kv, t, gl, cfg))()
        errs = []
        for z in (f32(P[:, 5:] + bias), f32(P[:, 5:]) + f32(bias)):  # sum rounded / not
            values = jax.nn.sigmoid(z).astype(dt).reshape(B, G * h, 3)
            want = jax.jit(lambda: nsa_decode_pallas(q, kv, t, values, cfg))()
            errs.append(rel_err(got, want))
        assert min(errs) <= 1e-6, (dt, errs)
    with pytest.raises(ValueError, match="GateLogits"):
        nsa_decode_pallas(q, kv, t, GateLogits(Columns(P, 5, (3 * G * h - 3,)), bias, dt), cfg)
    with pytest.raises(ValueError, match="inside"):
        nsa_decode_pallas(q, kv, t, GateLogits(Columns(P, 6, (3 * G * h,)), bias, dt), cfg)


def test_gate_logits_add_the_bias_in_the_logits_dtype():
    """``GateLogits`` in bf16 against gate values formed step by step in numpy (ml_dtypes: logit
    + bias rounded to bf16, the sigmoid in float32 rounded to bf16, as ``GateLogits`` documents):
    the same output to 1e-6, while the values from the unrounded sum give another output. The
    kernels' step is compiled without XLA's excess precision, which on the CPU (interpret mode)
    keeps the bf16 sum in float32 too. (The model-gates test above accepts either sum, as XLA may
    skip the rounding inside its own fusion, so an add in float32 in the kernel passed it.)"""
    import ml_dtypes

    from nsa_jax.pallas.cache_write import Columns
    from nsa_jax.pallas.decode import GateLogits, nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16)
    B, G, h, D, S = 2, 2, 3, 16, 96
    bf = jnp.bfloat16
    ks = jax.random.split(jax.random.PRNGKey(7), 9)
    Tc = cfg.num_cmp_blocks(S)
    t = jnp.asarray([70, 41], jnp.int32)
    kv = {n: jax.random.normal(k, (B, G, L, D), bf) for k, (n, L) in zip(ks, [
        ("k_cmp", Tc), ("v_cmp", Tc), ("k_slc", S), ("v_slc", S), ("k_win", 16), ("v_win", 16)])}
    q = jax.random.normal(ks[6], (B, G * h, D), bf)
    P = (2 * jax.random.normal(ks[7], (B, 5 + 3 * G * h))).astype(bf)
    bias = (0.5 * jax.random.normal(ks[8], (3 * G * h,))).astype(bf)
    gl = GateLogits(Columns(P, 5, (3 * G * h,)), bias, bf)
    # XLA (the interpreter's kernels on the CPU) may otherwise keep the bf16 sum in float32
    got = jax.jit(lambda: nsa_decode_pallas(q, kv, t, gl, cfg)).lower().compile(
        {"xla_allow_excess_precision": False})()
    with_values = jax.jit(lambda g: nsa_decode_pallas(q, kv, t, g, cfg))

    def values(z):                                  # float32 [B, 3Hq] -> bf16 gates [B,Hq,3]
        g = (1.0 / (1.0 + np.exp(-z))).astype(ml_dtypes.bfloat16)
        return jnp.asarray(g).reshape(B, G * h, 3)

    Pn, bn = np.asarray(P[:, 5:]), np.asarray(bias)                  # ml_dtypes bfloat16
    want = with_values(values((Pn + bn).astype(np.float32)))          # the sum rounded to bf16
    unrounded = with_values(values(Pn.astype(np.float32) + bn.astype(np.float32)))
    assert rel_err(got, want) <= 1e-6, rel_err(got, want)
    assert rel_err(unrounded, want) > 1e-4, rel_err(unrounded, want)  # the rounding matters


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_init_cache_is_zeros_in_distinct_buffers(attention):
    """``init_cache`` builds every array in one jitted call: each comes back zero, in the dtype
    and shape the layout names, and in its own buffer (a prefill donates the cache, so two
    leaves sharing one buffer would break it)."""
    from nsa_jax.decode import init_cache
    model = _model(attention)
    cache = init_cache(model, 2, 100)
    want = jax.eval_shape(lambda: init_cache(model, 2, 100))
    leaves = jax.tree.leaves(cache)
    assert jax.tree.structure(cache) == jax.tree.structure(want)
    for a, w in zip(leaves, jax.tree.leaves(want)):
        assert (a.shape, a.dtype) == (w.shape, w.dtype) and not np.asarray(a).any()
    assert len({a.unsafe_buffer_pointer() for a in leaves}) == len(leaves)
    if attention == "nsa":
        lc = cache["layers"][0]
        sz = cache_sizes(model.ncfg, 100)
        assert lc["k_cmp"].shape[2] == sz["cmp"] and lc["sync"].dtype == jnp.int32
        assert lc["k_slc"].dtype == model.dtype
