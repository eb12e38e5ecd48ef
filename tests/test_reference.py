"""The pure-JAX reference against an independent numpy brute force, plus structural properties."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_bruteforce import brute_nsa
from nsa_jax.nsa import NSAConfig, NSAConfigError
from nsa_jax.nsa import nsa_attention as _nsa_attention
from nsa_jax.nsa import select_blocks as _select_blocks
from nsa_jax.nsa import reference as ref
from nsa_testutil import random_inputs, rel_err

# jitted once per (shapes, cfg): eager op-by-op dispatch would dominate the test time
nsa_attention = jax.jit(_nsa_attention, static_argnames=("cfg", "impl"))
select_blocks = jax.jit(_select_blocks, static_argnames=("cfg",))

# (l, d, l', n, w, n_init, n_local, B, T, G, h)
CASES = [
    (8, 4, 16, 4, 16, 1, 2, 2, 50, 2, 2),      # T not a multiple of l', batch > 1
    (16, 8, 16, 3, 8, 1, 2, 1, 40, 1, 4),      # l == l', MQA (G = 1)
    (4, 4, 8, 3, 5, 1, 2, 1, 33, 3, 1),        # l == d, odd window, h = 1
    (8, 8, 8, 2, 7, 0, 1, 2, 37, 2, 1),        # no initial block, one local block
    (8, 4, 32, 5, 12, 2, 1, 1, 97, 2, 3),      # two initial blocks
    (32, 16, 64, 4, 64, 1, 2, 1, 300, 1, 2),   # paper l, d, l' with a small n
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_reference_matches_bruteforce(case):
    l, d, lp, n, w, ni, nl, B, T, G, h = case
    cfg = NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=n, window=w, n_init=ni, n_local=nl)
    # a large scale makes the compressed softmax peaky, so scores really differ between blocks
    args = random_inputs(hash(case) % 1000, B, T, G * h, G, 8, 6, cfg, scale=2.0)
    want_out, want_sel = brute_nsa(*[np.asarray(a) for a in args], l, d, lp, n, w, ni, nl)
    got_sel = np.asarray(select_blocks(args[0], args[1], cfg))
    np.testing.assert_array_equal(got_sel, want_sel)
    got = nsa_attention(*args, cfg, impl="reference")
    assert got.shape == want_out.shape and got.dtype == jnp.float32
    assert rel_err(got, want_out) < 1e-5
    # the selection really is data dependent here (not just the forced blocks)
    assert len({tuple(r) for r in want_sel.reshape(-1, n)[-G * 8:]}) > 1 or n * lp >= T


@pytest.mark.parametrize("branches", [("cmp",), ("slc", "win"), ("win",)])
def test_branch_ablation_matches_bruteforce(branches):
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8, branches=branches)
    args = random_inputs(3, 1, 45, 4, 2, 8, 8, cfg)
    want, _ = brute_nsa(*[np.asarray(a) for a in args], 8, 4, 16, 3, 8, branches=branches)
    assert rel_err(nsa_attention(*args, cfg), want) < 1e-5


def test_overlap_weights_paper_default():
    cfg = NSAConfig()
    W = ref.overlap_weights(cfg.num_cmp_blocks(1024), cfg.num_sel_blocks(1024), cfg)
    j = 3
    col = W[:, j]
    nz = np.nonzero(col)[0]
    np.testing.assert_array_equal(nz, np.arange(4 * j - 1, 4 * j + 4))
    np.testing.assert_array_equal(col[nz], [1, 2, 2, 2, 1])
    assert W[:, 0][np.nonzero(W[:, 0])[0]].tolist() == [2, 2, 2, 1]


@pytest.mark.parametrize("T,expected", [(0, 0), (31, 0), (32, 1), (47, 1), (48, 2), (1024, 63)])
def test_num_cmp_blocks(T, expected):
    assert NSAConfig().num_cmp_blocks(T) == expected


def _dense_causal(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


@pytest.mark.parametrize("G,h", [(1, 3), (2, 2)])
def test_full_budget_branches_equal_dense(G, h):
    """With n*l' >= T and w >= T, the selection and window branches are dense causal attention."""
    T = 70
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=5, window=T)
    q, kc, vc, ks, vs, kw, vw, _ = random_inputs(1, 2, T, G * h, G, 16, 16, cfg)
    one = lambda c: jnp.zeros((2, T, G * h, 3)).at[..., c].set(1.0)
    dense_s = _dense_causal(q, ks, vs)
    dense_w = _dense_causal(q, kw, vw)
    assert rel_err(nsa_attention(q, kc, vc, ks, vs, kw, vw, one(1), cfg), dense_s) < 1e-6
    assert rel_err(nsa_attention(q, kc, vc, ks, vs, kw, vw, one(2), cfg), dense_w) < 1e-6


def test_compressed_branch_zero_before_first_block():
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8)
    q, kc, vc, *_ = random_inputs(2, 1, 30, 2, 1, 8, 8, cfg)
    o = ref.compressed_attention(q, kc, vc, cfg)
    assert np.all(np.asarray(o[:, :7]) == 0.0)
    assert np.all(np.abs(np.asarray(o[:, 7:])).sum(-1) > 0)


def test_compressed_branch_with_no_blocks_at_all():
    cfg = NSAConfig(block_l=16, stride_d=8, sel_block=32, n_sel=3, window=4)
    args = random_inputs(0, 1, 10, 2, 1, 8, 8, cfg)  # T < l: Tc = 0
    assert args[1].shape[1] == 0
    out = nsa_attention(*args, cfg)
    want, _ = brute_nsa(*[np.asarray(a) for a in args], 16, 8, 32, 3, 4)
    assert rel_err(out, want) < 1e-5


BRANCH_CASES = {"cmp": 0, "slc": 1, "win": 2}


@pytest.mark.parametrize("branch", list(BRANCH_CASES))
def test_causality_of_each_branch(branch):
    """d out[t] / d input[s] is exactly zero for s > t (k_cmp block i 'is at' i*d + l - 1)."""
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=10)
    T = 48
    args = random_inputs(5, 1, T, 4, 2, 8, 8, cfg)
    gates = jnp.zeros_like(args[-1]).at[..., BRANCH_CASES[branch]].set(1.0)
    args = args[:-1] + (gates,)
    cmp_pos = np.arange(cfg.num_cmp_blocks(T)) * 4 + 8 - 1
    _, vjp = jax.vjp(lambda *a: nsa_attention(*a, cfg), *args)   # one forward, 4 cotangents
    for t in (5, 17, 31, 40):
        ct = jnp.zeros((1, T, 4, 8)).at[:, t].set(1.0)
        grads = vjp(ct)
        names = ["q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates"]
        for name, g in zip(names, grads):
            g = np.asarray(g)
            if name in ("k_cmp", "v_cmp"):
                future = g[:, cmp_pos > t]
            else:
                future = g[:, t + 1:]
            assert np.all(future == 0.0), (branch, t, name)
        # and the gradient does flow into the past (cmp: once a block is complete)
        if branch != "cmp" or t >= cfg.block_l - 1:
            assert np.abs(np.asarray(grads[0][:, t])).sum() > 0


def test_group_shared_selection_and_forced_blocks():
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=8, n_sel=4, window=8, n_init=1, n_local=2)
    B, T, G, h = 2, 90, 2, 3
    q, kc, *_ = random_inputs(11, B, T, G * h, G, 8, 8, cfg, scale=3.0)
    idx = np.asarray(select_blocks(q, kc, cfg))
    assert idx.shape == (B, T, G, 4) and idx.dtype == np.int32
    for t in range(T):
        cur = t // 8
        for b in range(B):
            for g in range(G):
                row = idx[b, t, g]
                valid = row[row >= 0]
                assert np.all(np.diff(valid) > 0), "ascending, no duplicates"
                assert np.all(row[len(valid):] == -1), "-1 only at the end"
                assert len(valid) == min(4, cur + 1)
                assert np.all(valid <= cur), "only candidates j*l' <= t"
                for f in {0, cur, max(cur - 1, 0)}:
                    assert f in valid, (t, f, row)
    # permuting heads inside a group leaves the selection unchanged (group-summed scores, Eq. 10)
    perm = np.array([2, 0, 1, 4, 5, 3])
    np.testing.assert_array_equal(np.asarray(select_blocks(q[:, :, perm], kc, cfg)), idx)
    # moving a head to the other group changes it
    swap = np.array([3, 1, 2, 0, 4, 5])
    assert not np.array_equal(np.asarray(select_blocks(q[:, :, swap], kc, cfg)), idx)


def test_ties_go_to_lower_index():
    cfg = NSAConfig(block_l=4, stride_d=4, sel_block=4, n_sel=3, window=4, n_init=0, n_local=1)
    T, Ts = 24, 6
    scores = jnp.zeros((1, T, 1, Ts))  # all candidates tie
    idx = np.asarray(ref.topn_from_scores(scores, cfg))
    np.testing.assert_array_equal(idx[0, 23, 0], [0, 1, 5])
    np.testing.assert_array_equal(idx[0, 5, 0], [0, 1, -1])
    scores = scores.at[..., 3].set(1.0).at[..., 4].set(1.0)
    np.testing.assert_array_equal(np.asarray(ref.topn_from_scores(scores, cfg))[0, 23, 0], [3, 4, 5])


def test_bf16_inputs_softmax_in_f32():
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8)
    args32 = random_inputs(4, 1, 40, 4, 2, 16, 16, cfg)
    idx = select_blocks(args32[0], args32[1], cfg)
    args16 = [a.astype(jnp.bfloat16) for a in args32]
    out16 = nsa_attention(*args16, cfg, block_idx=idx)
    assert out16.dtype == jnp.bfloat16
    out32 = nsa_attention(*args32, cfg, block_idx=idx)
    assert rel_err(out16.astype(jnp.float32), out32) < 2e-2
    g = jax.grad(lambda q: nsa_attention(q, *args16[1:], cfg).astype(jnp.float32).sum())(args16[0])
    assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


@pytest.mark.parametrize("kwargs,key", [
    (dict(block_l=30, stride_d=16), "block_l"),
    (dict(sel_block=72, stride_d=16, block_l=32), "sel_block"),
    (dict(block_l=128, sel_block=64), "block_l"),
    (dict(n_sel=2), "n_sel"),
    (dict(window=0), "window"),
    (dict(n_local=-1), "n_local"),
    (dict(branches=("cmp", "foo")), "branches"),
    (dict(branches=()), "branches"),
])
def test_nsa_config_validation(kwargs, key):
    with pytest.raises(NSAConfigError, match=rf"^nsa\.{key}: "):
        NSAConfig(**kwargs)


def test_shape_errors_are_clear():
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8)
    args = list(random_inputs(0, 1, 40, 4, 2, 8, 8, cfg))
    args[1] = args[1][:, :-1]
    with pytest.raises(ValueError, match="k_cmp must have shape"):
        _nsa_attention(*args, cfg)
    with pytest.raises(ValueError, match="unknown impl"):
        _nsa_attention(*random_inputs(0, 1, 40, 4, 2, 8, 8, cfg), cfg, impl="cuda")
