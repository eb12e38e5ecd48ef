"""The sliding-window branch on the Mosaic GPU tiled kernels (``nsa_jax/pallas/mosaic_window.py``,
``KernelChoices.win_attn = "mosaic"``).

On the CPU: the window's fixed block lists, walked in the kernels' three runs (masked, unmasked,
masked) with the kernels' masks, cover exactly ``semantics.window_visible`` from both sides
(forward / dQ by query tile, dK/dV by key block); the kernels lower for CUDA; the choice resolves
and fails as documented. Values are checked on the GPU only (``gpu``-marked tests; Mosaic GPU has
no interpret mode here).
"""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig, semantics
from nsa_jax.pallas import mosaic_common as mc
from nsa_jax.pallas import mosaic_window as mw
from nsa_jax.pallas.window import window_attention
from nsa_testutil import (assert_rrmse_within, fake_hopper, lowered_op, random_inputs,
                          require_hopper, rrmse)

ROWS, KEYS = mc.ROWS, mc.KEYS


def S(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _visible(rows, keys, window):
    return np.asarray(semantics.window_visible(rows[:, None], keys[None, :], window))


def _kernel_mask(rows, keys, window):
    """The kernels' mask on a masked pair: key <= row and key > row - window."""
    r, k = rows[:, None], keys[None, :]
    return (k <= r) & (k > r - window)


@pytest.mark.parametrize("T,window", [(1024, 512), (1024, 64), (512, 128), (256, 512),
                                      (640, 192), (576, 128), (128, 4096)])
def test_window_lists_cover_the_window_from_both_sides(T, window):
    """Forward / dQ: tile i's listed blocks, the first ``edge_count`` and those from ``nfull`` on
    masked and the rest whole, give exactly the visible (row, key) pairs, and every unmasked
    pair is wholly visible. dK/dV: block j's listed tiles, [0, ndiag) and [nlate, count) masked,
    give the same pairs from the keys' side."""
    B, G = 2, 3
    nqt = T // ROWS
    (blocks, bcount, nfull, bias), (tiles, tcount, ndiag, nlate, bias_t) = \
        mw.window_lists(B, G, T, window)
    assert bias is None and bias_t is None
    width = min(window // KEYS, nqt - 1) + 1
    for x, shape in ((blocks, (nqt, width)), (bcount, (nqt,)), (tiles, (nqt, width))):
        assert x.shape[:2] == (B, G) and x.dtype == jnp.int32
        assert x.shape[2:] == shape
    blocks, bcount, nfull = (np.asarray(a)[1, 2] for a in (blocks, bcount, nfull))
    tiles, tcount, ndiag, nlate = (np.asarray(a)[1, 2] for a in (tiles, tcount, ndiag, nlate))
    want = _visible(np.arange(T), np.arange(T), window)
    got = np.zeros((T, T), bool)
    for i in range(nqt):
        rows = np.arange(i * ROWS, (i + 1) * ROWS)
        edge = int(mc.edge_count(jnp.int32(i), window))
        listed = blocks[i, :bcount[i]]
        assert (np.diff(listed) == 1).all() and listed[-1] == i
        for u, j in enumerate(listed):
            keys = np.arange(j * KEYS, (j + 1) * KEYS)
            if u < edge or u >= nfull[i]:
                vis = _kernel_mask(rows, keys, window)
            else:
                vis = np.ones((ROWS, KEYS), bool)
                assert _visible(rows, keys, window).all(), (i, j)
            assert not (got[np.ix_(rows, keys)] & vis).any(), "a pair listed twice"
            got[np.ix_(rows, keys)] |= vis
    np.testing.assert_array_equal(got, want)
    got_t = np.zeros((T, T), bool)
    for j in range(nqt):
        keys = np.arange(j * KEYS, (j + 1) * KEYS)
        listed = tiles[j, :tcount[j]]
        assert listed[0] == j and ndiag[j] == 1 and (np.diff(listed) == 1).all()
        for u, i in enumerate(listed):
            rows = np.arange(i * ROWS, (i + 1) * ROWS)
            if u < ndiag[j] or u >= nlate[j]:
                vis = _kernel_mask(rows, keys, window)
            else:
                vis = np.ones((ROWS, KEYS), bool)
                assert _visible(rows, keys, window).all(), (i, j)
            got_t[np.ix_(rows, keys)] |= vis
    np.testing.assert_array_equal(got_t, want)


@pytest.mark.parametrize("h,D", [(6, 64), (16, 128)])
def test_window_kernels_lower_for_cuda(h, D):
    """The branch's forward and backward lower for CUDA to the three Mosaic GPU kernels and
    nothing from Triton (jax's ``lowering_platforms``; no GPU needed)."""
    B, T, G = 2, 1024, 2

    def loss(q, k, v):
        return jnp.sum(mw.window_attention_mosaic(q, k, v, 512).astype(jnp.float32) ** 2)

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        S(B, T, G * h, D), S(B, T, G, D), S(B, T, G, D)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert set(re.findall(r"nsa_win_\w*?_mgpu", text)) == {
        "nsa_win_fwd_mgpu", "nsa_win_bwd_dq_mgpu", "nsa_win_bwd_dkv_mgpu"}
    assert "tt.func" not in text


def test_window_unsupported_names_each_reason(monkeypatch):
    q, k = S(1, 128, 4, 64), S(1, 128, 2, 64)
    assert "GPU" in mw.window_unsupported(q, k, k, 512, True)
    assert "Hopper" in mw.window_unsupported(q, k, k, 512, False)   # the CPU here
    fake_hopper(monkeypatch)
    assert mw.window_unsupported(q, k, k, 512, False) is None
    for w in (32, 100):
        assert "multiple of 64" in mw.window_unsupported(q, k, k, w, False)
    assert "even number" in mw.window_unsupported(S(1, 128, 6, 64), k, k, 512, False)


def test_win_attn_mosaic_where_it_cannot_run_is_one_error():
    q = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    k = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"kernel\.win_attn: 'mosaic' cannot run here: it needs "
                                         r"a GPU"):
        window_attention(q, k, k, NSAConfig(), True, choices=KernelChoices(win_attn="mosaic"))
    with pytest.raises(ValueError, match="kernel.win_attn"):
        KernelChoices(win_attn="cuda")


def test_op_runs_the_window_kernels_when_chosen(monkeypatch):
    """The whole op's fwd+bwd lowered for CUDA on a (faked) Hopper with win_attn="mosaic": the
    window branch is the three Mosaic GPU window kernels and no document-local kernel."""
    fake_hopper(monkeypatch)
    text = lowered_op(NSAConfig(), KernelChoices(sel_impl="tiled", cmp_attn="pallas",
                                                 win_attn="mosaic"), 1, 1024, 12, 2, 64)
    assert set(re.findall(r"nsa_win_\w*?_mgpu", text)) == {
        "nsa_win_fwd_mgpu", "nsa_win_bwd_dq_mgpu", "nsa_win_bwd_dkv_mgpu"}
    assert "nsa_local" not in text


# ---- GPU (compiled on a Hopper GPU) -------------------------------------------------------------
def _window_reference(q, k, v, window):
    """float32 masked attention over ``semantics.window_visible`` (the oracle)."""
    B, T, Hq, D = q.shape
    G = k.shape[2]
    qg = q.reshape(B, T, G, Hq // G, D)
    s = jnp.einsum("btghd,bsgd->btghs", qg, k, precision="highest") / math.sqrt(D)
    t = jnp.arange(T)
    vis = semantics.window_visible(t[:, None], t[None, :], window)[None, :, None, None, :]
    p = semantics.masked_softmax(s, vis)
    return jnp.einsum("btghs,bsgd->btghd", p, v, precision="highest").reshape(B, T, Hq, D)


@pytest.mark.gpu
@pytest.mark.parametrize("T,Hq,G,D,window", [(2048, 12, 2, 64, 512), (1024, 32, 2, 128, 512),
                                             (256, 2, 1, 64, 512), (512, 4, 2, 64, 64)])
def test_gpu_window_matches_reference_and_cudnn(T, Hq, G, D, window):
    """Output and dQ, dK, dV of the Mosaic GPU window branch against the float32 oracle and
    cuDNN's local-window attention (relative RMSE <= 5e-3); w > T and w = 64 included."""
    q0, k0 = S(1, T, Hq, D), S(1, T, G, D)
    require_hopper(mw.window_unsupported(q0, k0, k0, window, False))
    B = 2
    ks = jax.random.split(jax.random.PRNGKey(T + Hq + window), 4)
    q = jax.random.normal(ks[0], (B, T, Hq, D)).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], (B, T, G, D)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], (B, T, G, D)).astype(jnp.bfloat16)
    cot = jax.random.normal(ks[3], (B, T, Hq, D), jnp.float32)
    cfg = NSAConfig(window=window)

    def run(fn, *a):
        o, vjp = jax.vjp(fn, *a)
        return (o,) + vjp(cot.astype(o.dtype))

    def branch(win_attn):
        ch = KernelChoices(win_attn=win_attn)
        return jax.jit(lambda *a: run(lambda *x: window_attention(*x, cfg, False, choices=ch),
                                      *a))(q, k, v)

    got, cudnn = branch("mosaic"), branch("cudnn")
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.jit(lambda *a: run(lambda *x: _window_reference(*x, window), *a))(*f32)
    errs = {}
    for n, a, b_, c in zip(("o", "dq", "dk", "dv"), got, want, cudnn):
        assert a.shape == b_.shape
        errs[n] = rrmse(a, b_)
        errs[n + "_vs_cudnn"] = rrmse(a, c)
    print(T, Hq, G, D, window, end=" ")
    assert_rrmse_within(errs, 5e-3)


@pytest.mark.gpu
def test_gpu_full_nsa_with_mosaic_window_bf16():
    """The whole op with win_attn="mosaic" (and the tiled selection on its defaults) against the
    float32 reference: output and all 8 input gradients, relative RMSE <= 5e-3 (the issue's
    measure). The output is also held to the op with the window on cuDNN."""
    from nsa_jax.nsa import nsa_attention
    from nsa_jax.nsa import reference as ref
    cfg = NSAConfig()
    Hq, G, D, T, B = 12, 2, 64, 1024, 2
    q0, k0 = S(1, T, Hq, D), S(1, T, G, D)
    require_hopper(mw.window_unsupported(q0, k0, k0, cfg.window, False))
    args = random_inputs(11, B, T, Hq, G, D, D, cfg, dtype=jnp.bfloat16)
    idx = jax.jit(lambda q, kc: ref.select_blocks(q, kc, cfg))(
        args[0].astype(jnp.float32), args[1].astype(jnp.float32))
    cot = jax.random.normal(jax.random.PRNGKey(12), (B, T, Hq, D)).astype(jnp.bfloat16)

    def run(impl, a, c, ch):
        def f(*x):
            return nsa_attention(*x, cfg, impl, block_idx=idx, choices=ch)
        o, vjp = jax.vjp(f, *a)
        return o, vjp(c.astype(o.dtype))

    o, grads = jax.jit(lambda *a: run("pallas", a, cot, KernelChoices(win_attn="mosaic")))(*args)
    o_c = jax.jit(lambda *a: run("pallas", a, cot, KernelChoices(win_attn="cudnn"))[0])(*args)
    o_r, grads_r = jax.jit(lambda *a: run("reference", a, cot, None))(
        *[a.astype(jnp.float32) for a in args])
    errs = {"o": rrmse(o, o_r), "o_vs_cudnn": rrmse(o, o_c)}
    assert_rrmse_within(errs, 5e-3, grads, grads_r)
