"""The Mosaic GPU (Hopper) tiled selection kernels: forward (``nsa_jax/pallas/mosaic_tiled.py``),
dQ (``mosaic_tiled_dq.py``), dK/dV (``mosaic_tiled_dkv.py``).

On the CPU: the kernels lower for CUDA (Pallas -> Mosaic GPU, every tracing, layout and
shared-memory rule; PTX is not built), their row-bias operand equals the rows' membership, and
``sel_tiled_fwd`` / ``sel_tiled_dq`` / ``sel_tiled_dkv`` resolve as documented, with one error
naming the key where "mosaic" cannot run. jax's Mosaic GPU interpreter (``jax._src``) lacks the
register-operand wgmma and transposed shared-memory operands these kernels use, so values are
checked on the GPU only (``gpu``-marked tests below).
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas import mosaic_common as mc
from nsa_jax.pallas import mosaic_tiled as mt
from nsa_jax.pallas import mosaic_tiled_dkv as mtd
from nsa_jax.pallas import mosaic_tiled_dq as mtq
from nsa_jax.pallas.nsa import tiled_backend
from nsa_jax.pallas.tiled_index import member_table, tile_index, words_by_tile
from nsa_testutil import (assert_rrmse_within, fake_hopper, lowered_op, random_inputs,
                          require_hopper, rrmse)

CFG = NSAConfig()  # l' = 64


def S(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("h,D", [(6, 64), (16, 128)])
def test_mosaic_forward_lowers_for_cuda(h, D):
    """The whole forward, with its XLA-side lists and row bias, lowers for CUDA to one Mosaic GPU
    custom call (jax's ``lowering_platforms``; no GPU needed)."""
    B, T, G = 2, 512, 2
    f = jax.jit(lambda q, k, v, i: mt.sel_tiled_forward_mosaic(q, k, v, i, CFG, None, 0.125,
                                                               False))
    text = f.trace(S(B, T, G * h, D), S(B, T, G, D), S(B, T, G, D),
                   S(B, T, G, 16, dtype=jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu") >= 1
    assert "tt.func" not in text   # no Triton kernel inside


@pytest.mark.parametrize("h,D", [(6, 64), (16, 128)])
@pytest.mark.parametrize("kernel,gated", [("dq", True), ("dkv", True), ("dkv", False)])
def test_mosaic_backward_lowers_for_cuda(h, D, kernel, gated):
    """The dQ and dK/dV kernels lower for CUDA too, within shared memory at 128-wide heads,
    with the gate as a row operand; dK/dV also with it folded into lse and delta (gs None, as
    ``selection_tiled.sel_tiled_backward`` calls it)."""
    B, T, G = 2, 512, 2
    fn = {"dq": mtq.sel_tiled_bwd_dq_mosaic, "dkv": mtd.sel_tiled_bwd_dkv_mosaic}[kernel]
    f = jax.jit(lambda q, k, v, i, do, gs, lse, de: fn(q, k, v, i, do, gs if gated else None,
                                                       lse, de, CFG, 0.125, False))
    r = S(B, T, G * h, dtype=jnp.float32)
    text = f.trace(S(B, T, G * h, D), S(B, T, G, D), S(B, T, G, D),
                   S(B, T, G, 16, dtype=jnp.int32), S(B, T, G * h, D), r, r, r).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu") >= 1


def test_mosaic_forward_refuses_interpret_mode():
    x = jnp.zeros((1, 64, 2, 64), jnp.bfloat16)
    k = jnp.zeros((1, 64, 1, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="no interpret mode"):
        mt.sel_tiled_forward_mosaic(x, k, k, jnp.zeros((1, 64, 1, 16), jnp.int32), CFG, None,
                                    0.125, True)


def test_row_bias_is_each_rows_membership():
    """bias[b, g, i, u, r] = 0 iff row r of tile i listed block blocks[b, g, i, u] among its ids
    (duplicates and unused -1 slots included), else -inf."""
    B, T, G, n = 2, 256, 2, 5
    Ts = CFG.num_sel_blocks(T)
    rng = np.random.default_rng(0)
    idx = rng.integers(-1, Ts, size=(B, T, G, n)).astype(np.int32)
    idx[0, 3, 0, :] = 2                                   # one id five times
    blocks, bcount, _, _ = tile_index(jnp.asarray(idx), T, CFG, mc.ROWS)
    bias = np.asarray(mc.row_bias(words_by_tile(member_table(jnp.asarray(idx), T, CFG, mc.ROWS),
                                                blocks)))
    blocks, bcount = np.asarray(blocks), np.asarray(bcount)
    assert bias.shape == blocks.shape + (mc.ROWS,)
    checked = 0
    for b in range(B):
        for g in range(G):
            for i in range(T // mc.ROWS):
                for u in range(bcount[b, g, i]):
                    j = blocks[b, g, i, u]
                    rows = idx[b, i * mc.ROWS:(i + 1) * mc.ROWS, g, :]
                    want = np.where((rows == j).any(-1), 0.0, -np.inf)
                    np.testing.assert_array_equal(bias[b, g, i, u], want)
                    checked += 1
    assert checked > 20


def test_mosaic_unsupported_names_each_reason(monkeypatch):
    q, k = S(1, 128, 4, 64), S(1, 128, 2, 64)
    assert "GPU" in mc.mosaic_unsupported(q, k, k, CFG, None, True)
    assert "Hopper" in mc.mosaic_unsupported(q, k, k, CFG, None, False)  # the CPU here
    fake_hopper(monkeypatch, cc="8.0")
    assert "Hopper" in mc.mosaic_unsupported(q, k, k, CFG, None, False)
    fake_hopper(monkeypatch)
    assert mc.mosaic_unsupported(q, k, k, CFG, None, False) is None
    cases = {
        "bf16/fp16": (S(1, 128, 4, 64, dtype=jnp.float32), k, k, CFG, None),
        "head dims": (S(1, 128, 4, 32), S(1, 128, 2, 32), S(1, 128, 2, 32), CFG, None),
        "even number": (S(1, 128, 6, 64), S(1, 128, 2, 64), S(1, 128, 2, 64), CFG, None),
        "multiple of 64": (S(1, 100, 4, 64), S(1, 100, 2, 64), S(1, 100, 2, 64), CFG, None),
        "l' = 64": (q, k, k, NSAConfig(sel_block=32), None),
        "unpacked": (q, k, k, CFG, object()),
    }
    for want, args in cases.items():
        why = mc.mosaic_unsupported(*args, False)
        assert why is not None and want in why, (want, why)


@pytest.mark.parametrize("key", ["sel_tiled_fwd", "sel_tiled_dq", "sel_tiled_dkv"])
def test_tiled_backend_resolves_and_fails_by_key(monkeypatch, key):
    """"auto" takes Mosaic GPU where it runs and was measured faster (dK/dV at 64- and 128-wide
    heads, the forward and dQ at 128 only);
    "triton" always Triton; an explicit "mosaic" where it cannot run: one error naming the key
    and the reason."""
    q, k = S(1, 128, 4, 64), S(1, 128, 2, 64)
    wq, wk = S(1, 128, 4, 128), S(1, 128, 2, 128)
    def ch(v):
        return KernelChoices(**{key: v})
    for c in (None, KernelChoices(), ch("triton")):
        assert tiled_backend(key, c, wq, wk, wk, CFG, None, True) == "triton"
    with pytest.raises(ValueError, match=rf"kernel\.{key}: 'mosaic' cannot run here: "
                                         r"it needs a GPU"):
        tiled_backend(key, ch("mosaic"), q, k, k, CFG, None, True)
    fake_hopper(monkeypatch)
    assert tiled_backend(key, None, wq, wk, wk, CFG, None, False) == "mosaic"
    # 64 wide: dK/dV only (measured faster there; the forward and dQ were slower)
    assert tiled_backend(key, None, q, k, k, CFG, None, False) == \
        ("mosaic" if key == "sel_tiled_dkv" else "triton")
    assert tiled_backend(key, ch("mosaic"), q, k, k, CFG, None, False) == "mosaic"
    assert tiled_backend(key, ch("triton"), wq, wk, wk, CFG, None, False) == "triton"
    f32 = S(1, 128, 4, 128, dtype=jnp.float32)
    assert tiled_backend(key, None, f32, wk, wk, CFG, None, False) == "triton"
    with pytest.raises(ValueError, match=rf"kernel\.{key}.*bf16/fp16"):
        tiled_backend(key, ch("mosaic"), f32, wk, wk, CFG, None, False)


@pytest.mark.parametrize("Hq,D,want", [
    (12, 64, {"nsa_sel_tiled_bwd_dkv_mgpu"}),
    (8, 128, {"nsa_sel_tiled_fwd_mgpu", "nsa_sel_tiled_bwd_dq_mgpu", "nsa_sel_tiled_bwd_dkv_mgpu"}),
])
def test_op_runs_the_mosaic_kernels_auto_picks(monkeypatch, Hq, D, want):
    """The whole op's fwd+bwd lowered for CUDA on a (faked) Hopper with the default choices: the
    tiled kernels "auto" measured faster on Mosaic GPU are Mosaic GPU kernels and the others
    Triton (64-wide heads: dK/dV only; 128-wide: all three). Compressed and window branches on
    their Pallas kernels (cuDNN does not lower without a GPU)."""
    import re
    fake_hopper(monkeypatch)
    text = lowered_op(CFG, KernelChoices(sel_impl="tiled", cmp_attn="pallas", win_attn="pallas"),
                      1, 1024, Hq, 2, D)
    triton = {p.split('"')[0] for p in text.split('name = "')[1:]}
    mosaic = set(re.findall(r"nsa_sel_tiled_\w*?_mgpu", text))
    assert mosaic == want, mosaic
    every = {"nsa_sel_tiled_fwd", "nsa_sel_tiled_bwd_dq", "nsa_sel_tiled_bwd_dkv"}
    assert triton & every == {n for n in every if n + "_mgpu" not in want}, triton
    assert {"nsa_local_fwd", "nsa_cmp_fwd"} <= triton, triton


def test_backward_hands_its_index_to_the_other_kernels():
    """``sel_tiled_backward`` gives a dq_kernel / dkv_kernel the lists it built (with their tile
    height), and ``index_lists`` reuses them at 64-row tiles and builds its own otherwise: one
    index per backward where the heights agree."""
    from nsa_jax.pallas.selection_tiled import sel_tiled_backward
    from nsa_jax.pallas.tiled_index import tile_lists
    B, T, Hq, G, D = 1, 128, 2, 1, 16
    q = jnp.zeros((B, T, Hq, D), jnp.float32)
    k = jnp.zeros((B, T, G, D), jnp.float32)
    idx = jnp.zeros((B, T, G, CFG.n_sel), jnp.int32).at[..., 1].set(1)
    seen = {}

    def fake_dq(q, k, v, idx, do, gs, lse, delta, cfg, scale, interpret, **kw):
        seen.update(kw)
        return jnp.zeros(q.shape, jnp.float32)

    for bq in (64, 32):
        bs = BlockSizes(sel_tile_q=bq)
        sel_tiled_backward(q, k, k, idx, q, jnp.zeros((B, T, Hq)), q, None, CFG, bs, 0.1, True,
                           dq_kernel=fake_dq)
        height, built = seen["lists"]
        assert height == bq and seen["seg"] is None
        want = tile_lists(idx, T, CFG, bq, None)
        assert jax.tree.all(jax.tree.map(lambda a, b_: bool(jnp.array_equal(a, b_)), built, want))
        got = mc.index_lists(idx, T, CFG, None, seen["lists"])
        assert (got is built) == (bq == mc.ROWS)
        if bq != mc.ROWS:   # built at 64 rows instead
            assert got[0][0].shape[2] == T // mc.ROWS


@pytest.mark.parametrize("key", ["sel_tiled_fwd", "sel_tiled_dq", "sel_tiled_dkv"])
def test_kernel_choices_reject_unknown_tiled_backend(key):
    with pytest.raises(ValueError, match=f"kernel.{key}"):
        KernelChoices(**{key: "cuda"})


# ---- GPU (compiled on a Hopper GPU) -------------------------------------------------------------
def _require_hopper(T, Hq, G, D):
    require_hopper(mc.mosaic_unsupported(S(1, T, Hq, D), S(1, T, G, D), S(1, T, G, D), CFG,
                                         None, False))


def _inputs(seed, B, T, Hq, G, D):
    args = random_inputs(seed, B, T, Hq, G, D, D, CFG, dtype=jnp.bfloat16)
    idx = jax.jit(lambda q, kc: ref.select_blocks(q, kc, CFG))(
        args[0].astype(jnp.float32), args[1].astype(jnp.float32))
    return args, idx


def _backward_inputs(seed, do_seed, T, Hq, G, D, empty):
    """Two batch rows of bf16 inputs for the backward tests: q, k, v (the selection branch's),
    the gate gs, a cotangent dO, the selection (rows ``empty`` [(b, start, stop)] select
    nothing), the scale and the Triton kernels' tiles."""
    _require_hopper(T, Hq, G, D)
    args, idx = _inputs(seed, 2, T, Hq, G, D)
    for b, start, stop in empty:
        idx = idx.at[b, start:stop].set(-1)
    q = args[0]
    do = jax.random.normal(jax.random.PRNGKey(do_seed), q.shape)
    return (q, args[3], args[4], args[7][..., 1].astype(jnp.float32), do.astype(jnp.bfloat16),
            idx, 1.0 / math.sqrt(D), BlockSizes.for_shape(Hq // G, D))


@pytest.mark.gpu
@pytest.mark.parametrize("T,Hq,G,D", [(2048, 12, 2, 64), (1024, 32, 2, 128), (256, 2, 1, 64)])
def test_gpu_mosaic_forward_matches_reference_and_triton(T, Hq, G, D):
    """o and lse against the float32 reference's selection branch (relative RMSE <= 5e-3) and
    the Triton tiled forward. Rows with no selected block give o = 0 and lse = +inf, as the
    Triton kernel's contract says: half of a tile (rows 64-95 of batch row 1, a -inf row bias on
    every pair of a non-empty list) and a whole tile (rows 128-191 of batch row 0: an empty
    list)."""
    from nsa_jax.pallas.selection_tiled import sel_tiled_forward
    _require_hopper(T, Hq, G, D)
    B = 2
    args, idx = _inputs(T + Hq, B, T, Hq, G, D)
    idx = idx.at[1, 64:96].set(-1).at[0, 128:192].set(-1)
    q, k, v = args[0], args[3], args[4]
    scale = 1.0 / math.sqrt(D)
    o, lse = jax.jit(lambda *a: mt.sel_tiled_forward_mosaic(*a, CFG, None, scale, False))(
        q, k, v, idx)
    o_t, lse_t = jax.jit(lambda *a: sel_tiled_forward(*a, CFG, BlockSizes.for_shape(
        Hq // G, D), scale, False))(q, k, v, idx)
    assert o.dtype == q.dtype and lse.shape == (B, T, Hq)
    lse = np.asarray(lse)
    empty = np.zeros(lse.shape, bool)
    empty[1, 64:96] = True
    empty[0, 128:192] = True
    assert np.all(np.isposinf(lse[empty])) and np.all(np.asarray(o, np.float32)[empty] == 0)
    assert np.array_equal(np.isposinf(lse), np.isposinf(np.asarray(lse_t)))
    h = Hq // G
    errs = {}
    for g in range(G):   # the reference's [T, T] mask one group at a time
        hs, gg = slice(g * h, (g + 1) * h), slice(g, g + 1)
        f32 = [x.astype(jnp.float32) for x in (q[:, :, hs], k[:, :, gg], v[:, :, gg])]
        o_r = jax.jit(lambda a, b_, c, i: ref.selection_attention(a, b_, c, i, CFG))(
            *f32, idx[:, :, gg])
        errs[f"o{g}"] = rrmse(o[:, :, hs], o_r)
    errs["o_vs_triton"] = rrmse(o, o_t)
    fin = np.isfinite(lse)
    errs["lse_vs_triton"] = float(np.abs(lse[fin] - np.asarray(lse_t)[fin]).max())
    print(T, Hq, G, D, {k_: f"{e:.2e}" for k_, e in errs.items()})
    assert errs["lse_vs_triton"] <= 2e-2   # base-2 lse of bf16 logits, two summation orders
    bad = {k_: e for k_, e in errs.items() if k_ != "lse_vs_triton" and not e <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("T,Hq,G,D", [(2048, 12, 2, 64), (1024, 32, 2, 128), (256, 2, 1, 64)])
def test_gpu_mosaic_dq_matches_reference_and_triton(T, Hq, G, D):
    """dQ for the cotangent gs * dO against the float32 reference's and the Triton kernel's
    (relative RMSE <= 5e-3), with rows that selected nothing (dQ = 0 there)."""
    from nsa_jax.pallas.selection_tiled import sel_tiled_bwd_dq
    from nsa_jax.pallas.tiled_index import tile_lists
    q, k, v, gs, do, idx, scale, bs = _backward_inputs(T + 3 * Hq, T, T, Hq, G, D,
                                                       [(1, 64, 96), (0, 128, 192)])

    @jax.jit
    def run(q, k, v, idx, do, gs):
        o, lse = mt.sel_tiled_forward_mosaic(q, k, v, idx, CFG, None, scale, False)
        delta = gs * jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
        dq = mtq.sel_tiled_bwd_dq_mosaic(q, k, v, idx, do, gs, lse, delta, CFG, scale, False)
        (blocks, bcount, _, _), table = tile_lists(idx, T, CFG, bs.sel_tile_q, None)
        dq_t = sel_tiled_bwd_dq(q, k, v, idx, blocks, bcount, do, gs, lse, delta, CFG, bs,
                                scale, False, table=table)
        return dq, dq_t

    dq, dq_t = run(q, k, v, idx, do, gs)
    assert dq.dtype == jnp.float32 and dq.shape == q.shape
    assert np.all(np.asarray(dq)[1, 64:96] == 0) and np.all(np.asarray(dq)[0, 128:192] == 0)
    h = Hq // G
    errs = {"dq_vs_triton": rrmse(dq, dq_t)}
    for g in range(G):
        hs, gg = slice(g * h, (g + 1) * h), slice(g, g + 1)
        f32 = [x.astype(jnp.float32) for x in (q[:, :, hs], k[:, :, gg], v[:, :, gg])]
        cot = do[:, :, hs].astype(jnp.float32) * gs[:, :, hs, None]
        _, vjp = jax.vjp(lambda a: ref.selection_attention(a, f32[1], f32[2], idx[:, :, gg],
                                                           CFG), f32[0])
        errs[f"dq{g}"] = rrmse(dq[:, :, hs], vjp(cot)[0])
    print(T, Hq, G, D, end=" ")
    assert_rrmse_within(errs, 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("T,Hq,G,D", [(2048, 12, 2, 64), (1024, 32, 2, 128), (256, 2, 1, 64)])
def test_gpu_mosaic_dkv_matches_reference_and_triton(T, Hq, G, D):
    """dK, dV for the cotangent gs * dO against the float32 reference's and the Triton kernel's
    (relative RMSE <= 5e-3), with rows that selected nothing (rows 64-95 of batch row 1: a -inf
    row bias in every pair of their tile)."""
    from nsa_jax.pallas.common import fold_gate
    from nsa_jax.pallas.selection_tiled import sel_tiled_bwd_dkv
    from nsa_jax.pallas.tiled_index import tile_lists
    q, k, v, gs, do, idx, scale, bs = _backward_inputs(T + 5 * Hq, T + 1, T, Hq, G, D,
                                                       [(1, 64, 96)])

    @jax.jit
    def run(q, k, v, idx, do, gs):
        o, lse = mt.sel_tiled_forward_mosaic(q, k, v, idx, CFG, None, scale, False)
        delta = gs * jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
        dk, dv = mtd.sel_tiled_bwd_dkv_mosaic(q, k, v, idx, do, gs, lse, delta, CFG, scale,
                                              False)
        (_, _, tiles, tcount), table = tile_lists(idx, T, CFG, bs.sel_tile_q, None)
        lse_f, delta_f = fold_gate(lse, gs, o, do)   # the Triton kernel takes the gate folded
        dk_t, dv_t = sel_tiled_bwd_dkv(q, k, v, idx, tiles, tcount, do, lse_f, delta_f, CFG,
                                       bs, scale, False, table=table)
        return dk, dv, dk_t, dv_t

    dk, dv, dk_t, dv_t = run(q, k, v, idx, do, gs)
    assert dk.dtype == k.dtype and dv.shape == v.shape
    h = Hq // G
    errs = {"dk_vs_triton": rrmse(dk, dk_t), "dv_vs_triton": rrmse(dv, dv_t)}
    for g in range(G):
        hs, gg = slice(g * h, (g + 1) * h), slice(g, g + 1)
        f32 = [x.astype(jnp.float32) for x in (q[:, :, hs], k[:, :, gg], v[:, :, gg])]
        cot = do[:, :, hs].astype(jnp.float32) * gs[:, :, hs, None]
        _, vjp = jax.vjp(lambda kk, vv: ref.selection_attention(f32[0], kk, vv, idx[:, :, gg],
                                                                CFG), f32[1], f32[2])
        dk_r, dv_r = vjp(cot)
        errs[f"dk{g}"] = rrmse(dk[:, :, gg], dk_r)
        errs[f"dv{g}"] = rrmse(dv[:, :, gg], dv_r)
    print(T, Hq, G, D, end=" ")
    assert_rrmse_within(errs, 5e-3)


@pytest.mark.gpu
def test_gpu_full_nsa_with_mosaic_forward_bf16():
    """The whole op with the three tiled selection kernels on Mosaic GPU against the float32
    reference: output and all 8 input gradients, relative RMSE <= 5e-3."""
    from nsa_jax.nsa import nsa_attention
    Hq, G, D, T, B = 12, 2, 64, 1024, 2
    _require_hopper(T, Hq, G, D)
    args, idx = _inputs(7, B, T, Hq, G, D)
    cot = jax.random.normal(jax.random.PRNGKey(8), (B, T, Hq, D)).astype(jnp.bfloat16)
    choices = KernelChoices(sel_impl="tiled", sel_tiled_fwd="mosaic", sel_tiled_dq="mosaic",
                            sel_tiled_dkv="mosaic")

    def run(impl, a, c, i, ch):
        def f(*x):
            return jnp.vdot(nsa_attention(*x, CFG, impl, block_idx=i, choices=ch).astype(
                jnp.float32), c.astype(jnp.float32))
        return jax.jit(jax.value_and_grad(f, argnums=tuple(range(8))))(*a)

    val, grads = run("pallas", args, cot, idx, choices)
    f32 = [a.astype(jnp.float32) for a in args]
    val_r, grads_r = run("reference", f32, cot.astype(jnp.float32), idx, None)
    errs = {"loss": abs(float(val) - float(val_r)) / abs(float(val_r))}
    assert_rrmse_within(errs, 5e-3, grads, grads_r)


@pytest.mark.parametrize("per", [1, 2])
def test_walk_masks_exactly_the_steps_that_need_it(per):
    """``walk`` visits every step of ``per`` listed blocks once, unmasked exactly when all its
    blocks lie in [nedge, nfull) (wholly visible), masked otherwise (the window's first block,
    the diagonal, a last step's absent block); ``step_blocks`` gives the step's listed block ids
    and FAR for an absent one."""
    @functools.partial(jax.jit, static_argnames="window")
    def runs(nedge, nfull, count, window):
        steps = 8
        def step(u, carry, masked):
            return carry.at[u].add(jnp.where(masked, 1, 10))
        return mc.walk(step, jnp.zeros(steps, jnp.int32), nedge if window else None, nfull,
                       count, per)

    blocks = jnp.arange(100, 108, dtype=jnp.int32)[None, None, None]
    for window in (False, True):
        for count in range(0, 8):
            for nfull in range(0, count + 1):
                for nedge in ((0, 1) if window and nfull >= 1 else (0,)):
                    got = np.asarray(runs(nedge, nfull, count, window=window))
                    steps = -(-count // per)
                    for u in range(8):
                        if u >= steps:
                            assert got[u] == 0, (count, nfull, nedge, u)
                            continue
                        idx = range(u * per, u * per + per)
                        whole = all(nedge <= i < nfull for i in idx) if window else \
                            all(i < nfull for i in idx)
                        assert got[u] == (10 if whole else 1), (count, nfull, nedge, u, got)
                    if count:
                        for u in range(steps):
                            js = [int(j) for j in mc.step_blocks(blocks, 0, 0, 0, u, per,
                                                                 jnp.int32(count))]
                            want = [100 + i if i < count else mc.FAR
                                    for i in range(u * per, u * per + per)]
                            assert js == want, (count, u, js)


def test_mosaic_dq_lowers_with_two_blocks_per_step():
    """``dq_call(per=2)`` (measured on the GPU, not taken: ``mosaic_common.blocks_per_step``)
    still lowers for CUDA within shared memory at 64-wide heads, to another kernel than per=1;
    other step widths are refused (the masks tell two column halves apart)."""
    B, T, G, h, D = 1, 512, 2, 6, 64
    lists = mc.selection_lists(jnp.zeros((B, T, G, 16), jnp.int32), T, CFG, None)
    shapes = (S(B, T, G * h, D), S(B, T, G, D), S(B, T, G, D), S(B, T, G * h, D),
              S(B, G * h, 3, T, dtype=jnp.float32))

    def lowered(per):
        f = jax.jit(lambda q, k, v, do, rv: mtq.dq_call(q, k, v, do, rv, lists, 0.125, stages=3,
                                                        name="nsa_dq_steps", per=per))
        return f.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()

    one, two = lowered(1), lowered(2)
    assert "nsa_dq_steps" in one and "nsa_dq_steps" in two and one != two
    with pytest.raises(ValueError, match="blocks per step must be 1 or 2, got 3"):
        lowered(3)
