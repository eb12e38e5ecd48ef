"""GPU checks of the compiled Pallas-Triton NSA kernels (run on the device machine; skipped on CPU).

bf16 inputs through ``impl="pallas"`` against the float32 reference on the same (upcast) inputs:
relative RMSE <= 5e-3 for the output and the gradient of every input. Both sides get the same
block indices (near-tied block scores may rank differently in bf16), and the reference is
evaluated one KV group at a time to bound its O(T^2) memory.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig, nsa_attention
from nsa_jax.nsa import reference as ref
from nsa_jax.pallas import block_scores_pallas, select_blocks_pallas

pytestmark = pytest.mark.gpu

CFG = NSAConfig()  # l=32, d=16, l'=64, n=16, w=512 (paper defaults)
NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")
SHAPES = {"125m": (12, 2, 64), "bench": (64, 4, 128)}  # (Hq, G, D)


def _inputs(seed, T, Hq, G, D, dtype, cfg=CFG):
    ks = jax.random.split(jax.random.PRNGKey(seed), 9)
    Tc = cfg.num_cmp_blocks(T)
    n = lambda k, s: jax.random.normal(k, s, jnp.float32).astype(dtype)
    args = (n(ks[0], (1, T, Hq, D)), n(ks[1], (1, Tc, G, D)), n(ks[2], (1, Tc, G, D)),
            n(ks[3], (1, T, G, D)), n(ks[4], (1, T, G, D)), n(ks[5], (1, T, G, D)),
            n(ks[6], (1, T, G, D)), jax.nn.sigmoid(n(ks[7], (1, T, Hq, 3))).astype(dtype))
    cot = jax.random.normal(ks[8], (1, T, Hq, D), jnp.float32).astype(dtype)
    return args, cot


def _rel(a, b):
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    assert np.isfinite(a).all(), "non-finite values in the kernel result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _pallas_fwd_bwd(args, cot, **kw):
    """impl="pallas" output and input gradients; without ``choices`` the compressed branch runs
    the Pallas kernels (cmp_attn="pallas": the default "auto" would take cuDNN on a GPU, which
    ``test_cmp_attn_cudnn_matches_f32_reference`` covers)."""
    kw.setdefault("choices", KernelChoices(cmp_attn="pallas"))

    @jax.jit
    def run(args, cot):
        out, vjp = jax.vjp(lambda *a: nsa_attention(*a, CFG, impl="pallas", **kw), *args)
        return out, vjp(cot)
    return run(args, cot)


def _reference_by_group(args, cot, idx, G, cfg=CFG, segment_ids=None):
    """float32 reference output and input gradients, one KV group at a time."""
    h = args[0].shape[2] // G
    f32 = [a.astype(jnp.float32) for a in args]
    cot = cot.astype(jnp.float32)

    @jax.jit
    def one(q, kc, vc, ks, vs, kw, vw, gt, ig, c):
        f = lambda *a: ref.nsa_attention_reference(*a, cfg, block_idx=ig,
                                                   segment_ids=segment_ids)
        o, vjp = jax.vjp(f, q, kc, vc, ks, vs, kw, vw, gt)
        return o, vjp(c)

    outs, grads = [], [[] for _ in NAMES]
    for g in range(G):
        hs, gs = slice(g * h, (g + 1) * h), slice(g, g + 1)
        part = [f32[0][:, :, hs]] + [a[:, :, gs] for a in f32[1:7]] + [f32[7][:, :, hs]]
        o, gr = one(*part, idx[:, :, gs], cot[:, :, hs])
        outs.append(o)
        for lst, x in zip(grads, gr):
            lst.append(x)
    # q and gates split along heads, the keys/values along groups: both are axis 2.
    return jnp.concatenate(outs, 2), [jnp.concatenate(lst, 2) for lst in grads]


@pytest.mark.parametrize("shape,T", [("125m", 2048), ("125m", 8192), ("bench", 2048),
                                     ("bench", 8192),
                                     # odd T: the cuDNN window path pads (a 3-token prompt failed).
                                     # T >= 48 so that Tc >= 2: with a single compressed block the
                                     # exact d k_cmp is 0 and a relative error is undefined.
                                     ("125m", 53), ("125m", 1027)])
def test_bf16_matches_f32_reference(shape, T, **kw):
    Hq, G, D = SHAPES[shape]
    args, cot = _inputs(T + Hq, T, Hq, G, D, jnp.bfloat16)
    idx = jax.jit(lambda q, kc: select_blocks_pallas(q, kc, CFG))(args[0], args[1])
    out, grads = _pallas_fwd_bwd(args, cot, block_idx=idx, **kw)
    assert out.dtype == jnp.bfloat16
    ro, rgrads = _reference_by_group(args, cot, idx, G)
    errs = {"out": _rel(out, ro)}
    errs.update({n: _rel(a, b) for n, a, b in zip(NAMES, grads, rgrads)})
    print(shape, T, kw, {k: f"{v:.2e}" for k, v in errs.items()})
    bad = {k: v for k, v in errs.items() if not v <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"


@pytest.mark.parametrize("shape,T", [("125m", 2048), ("125m", 1027), ("bench", 2048)])
def test_pallas_window_bf16_matches_f32_reference(shape, T):
    """The window branch by the document-local Pallas kernel (KernelChoices.win_attn="pallas",
    one document per row) instead of cuDNN: the same bf16-vs-float32 check as above."""
    test_bf16_matches_f32_reference(shape, T, choices=KernelChoices(cmp_attn="pallas",
                                                                    win_attn="pallas"))


@pytest.mark.parametrize("shape,T", [("125m", 2048), ("125m", 1027), ("bench", 1027)])
def test_sel_fwd_block_bf16_matches_f32_reference(shape, T):
    """The block-major selection kernels (KernelChoices.sel_fwd="block" and sel_dq="block",
    gather kernels: bf16 partial outputs and bf16 dQ partials) on the GPU: the same
    bf16-vs-float32 check as above. (The defaults take them at ("125m", 8192) above.)"""
    test_bf16_matches_f32_reference(shape, T, choices=KernelChoices(
        cmp_attn="pallas", sel_impl="gather", sel_fwd="block", sel_dq="block"))


@pytest.mark.parametrize("sel_dq", ["block", "ds"])
@pytest.mark.parametrize("shape,T", [("bench", 1027), ("bench", 2048)])
def test_sel_dq_with_query_forward_bf16_matches_f32_reference(shape, T, sel_dq):
    """The per-query forward with dQ formed from the inverted dK/dV kernel
    (KernelChoices.sel_fwd="query"; sel_dq="block": per-slot dQ partials, "ds": the dS stored in
    entry order and the dQ-from-dS kernel; the backward builds its own index) on the GPU, bf16
    against the float32 reference."""
    test_bf16_matches_f32_reference(shape, T, choices=KernelChoices(
        cmp_attn="pallas", sel_impl="gather", sel_fwd="query", sel_dq=sel_dq))


def test_sel_block_passes_bf16_matches_f32_reference():
    """The block-major kernels with the slots in 3 passes (``KernelChoices.sel_partial_mib``
    bounding the partial buffers as the 64k step's default does, at a size where the float32
    reference fits)."""
    test_bf16_matches_f32_reference("125m", 2048, choices=KernelChoices(
        cmp_attn="pallas", sel_impl="gather", sel_fwd="block", sel_dq="block",
        sel_partial_mib=16))


@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_topn_compiled_equals_semantics_64k(kind):
    """The compiled top-n kernel at 64k (rows of up to 1024 columns) == ``lax.top_k``'s rule,
    for distinct scores and 3-valued scores (ties)."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_pallas
    B, T, G = 1, 65536, 2
    Ts = CFG.num_sel_blocks(T)
    key = jax.random.PRNGKey(3)
    if kind == "distinct":
        scores = jax.random.uniform(key, (B, T, G, Ts))
    else:
        scores = jax.random.randint(key, (B, T, G, Ts), 0, 3).astype(jnp.float32) / 2
    want = semantics.topn_from_scores(scores, jnp.arange(T)[None, :, None], CFG)
    got = jax.jit(lambda s: topn_pallas(s, CFG, False))(scores)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_topn_upto_compiled_equals_semantics_64k_cache(kind):
    """A continuation chunk's compiled top-n (``topn.topn_upto``: the tournament with its first
    pass bounded on the device) over a 65,600-token cache's 1,025 columns, 4,096 rows at each of
    three traced starts (one compile) == ``lax.top_k``'s rule, distinct and 3-valued scores."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.topn import topn_upto
    B, C, G, Ts = 1, 4096, 2, CFG.num_sel_blocks(65600)
    key = jax.random.PRNGKey(5)
    if kind == "distinct":
        scores = jax.random.uniform(key, (B, C, G, Ts))
    else:
        scores = jax.random.randint(key, (B, C, G, Ts), 0, 3).astype(jnp.float32) / 2
    run = jax.jit(lambda s, s0: topn_upto(s, CFG, False, (s0 + jnp.arange(C))[None], s0 + C - 1,
                                          CFG.sel_block + C - 1))
    for start in (4096, 30720, 61440):
        rel = start + jnp.arange(C)[None]
        want = semantics.topn_from_scores(scores, rel[:, :, None], CFG)
        np.testing.assert_array_equal(np.asarray(run(scores, jnp.int32(start))),
                                      np.asarray(want), err_msg=f"start {start}")


@pytest.mark.parametrize("shape,layout", [("125m", "rows"), ("125m", "loop"), ("bench", "auto")])
def test_scores_and_selection_f32(shape, layout):
    """float32 on the GPU: fused scores match the reference's Eq. 9-10 and the selection agrees
    except at near-ties; both scoring tile layouts at h = 6."""
    Hq, G, D = SHAPES[shape]
    T = 2048
    args, _ = _inputs(7, T, Hq, G, D, jnp.float32)
    q, kc = args[0], args[1]
    ch = KernelChoices(score_heads=layout)
    sp = jax.jit(lambda a, b: block_scores_pallas(a, b, CFG, choices=ch))(q, kc)
    with jax.default_matmul_precision("highest"):
        sr = jax.jit(lambda a, b: ref.block_scores(ref.cmp_probs(a, b, CFG), T, CFG))(q, kc)
        ir = jax.jit(lambda a, b: ref.select_blocks(a, b, CFG))(q, kc)
    assert _rel(sp, sr) <= 1e-5
    ip = jax.jit(lambda a, b: select_blocks_pallas(a, b, CFG, choices=ch))(q, kc)
    agree = float(jnp.mean(jnp.all(ip == ir, axis=-1)))
    assert agree >= 0.999, f"selection rows agreeing: {agree:.4f}"


@pytest.mark.parametrize("cmp_attn", ["pallas", "auto"])
def test_no_nan_at_64k(cmp_attn):
    Hq, G, D = SHAPES["bench"]
    T = 65536
    args, cot = _inputs(3, T, Hq, G, D, jnp.bfloat16)
    out, grads = _pallas_fwd_bwd(args, cot, choices=KernelChoices(cmp_attn=cmp_attn))
    for name, x in zip(("out",) + NAMES, (out,) + tuple(grads)):
        assert bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))), f"non-finite {name} at T={T}"
    scale = math.sqrt(float(jnp.mean(out.astype(jnp.float32) ** 2)))
    assert 0 < scale < 10


# ---- float32 on the GPU: exact (IEEE) products, whatever the global matmul precision -----------
@pytest.mark.parametrize("shape,T,sel_impl", [("125m", 1027, "gather"), ("125m", 1027, "tiled"),
                                              ("bench", 2048, "auto")])
def test_f32_matches_reference_whatever_the_global_precision(shape, T, sel_impl):
    """float32 through impl="pallas" with KernelChoices(f32_dot="ieee") (the default), traced
    under jax_default_matmul_precision="default" (tf32 for XLA on this GPU), against the float32
    reference under "highest": output and all 8 input gradients within 2e-5 relative. The same
    run with f32_dot="tf32" must differ by more (the switch reaches the dots) and stay <= 5e-3."""
    Hq, G, D = SHAPES[shape]
    args, cot = _inputs(T + 1, T, Hq, G, D, jnp.float32)
    with jax.default_matmul_precision("highest"):
        idx = jax.jit(lambda q, kc: ref.select_blocks(q, kc, CFG))(args[0], args[1])
        ro, rgrads = _reference_by_group(args, cot, idx, G)
    errs = {}
    for f32_dot in ("ieee", "tf32"):
        ch = KernelChoices(sel_impl=sel_impl, f32_dot=f32_dot)
        with jax.default_matmul_precision("default"):
            out, grads = _pallas_fwd_bwd(args, cot, block_idx=idx, choices=ch)
        e = {"out": _rel(out, ro)}
        e.update({n: _rel(a, b) for n, a, b in zip(NAMES, grads, rgrads)})
        errs[f32_dot] = e
        print(shape, T, sel_impl, f32_dot, {k: f"{v:.2e}" for k, v in e.items()})
    bad = {k: v for k, v in errs["ieee"].items() if not v <= 2e-5}
    assert not bad, f"f32_dot=ieee: relative error above 2e-5: {bad}"
    assert errs["tf32"]["out"] > 2e-5, "f32_dot=tf32 gave IEEE-exact output: switch not applied"
    bad = {k: v for k, v in errs["tf32"].items() if not v <= 5e-3}
    assert not bad, f"f32_dot=tf32: relative error above 5e-3: {bad}"


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason="measured on an H200, jax 0.11.2: 0.90 relative error; "
                   "the model uses the masked path until the cuDNN packed call is fixed")
@pytest.mark.parametrize("T", [2048])   # the masked XLA reference does not fit at 8192
def test_dense_packed_cudnn_matches_masked_xla(T):
    """Packed documents on the dense path: cuDNN's packed (THD) layout == an explicit
    same-document causal mask (issue #16), values and gradients, bf16."""
    from nsa_jax.dense_packed import dense_packed_attention
    rng = np.random.default_rng(0)
    lengths = [1, 31, 64, 700, 5]
    lengths.append(T - sum(lengths))
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0), jnp.int32)
    q, k, v = (jnp.asarray(rng.standard_normal((2, T, n, 64)), jnp.bfloat16)
               for n in (8, 2, 2))
    ct = jnp.asarray(rng.standard_normal((2, T, 8, 64)), jnp.bfloat16)

    def run(impl):
        o, vjp = jax.vjp(lambda *a: dense_packed_attention(*a, seg, impl), q, k, v)
        return (o,) + vjp(ct)

    for a, b in zip(jax.jit(lambda: run("cudnn"))(), jax.jit(lambda: run("xla"))()):
        assert _rel(a, b) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048])   # the masked XLA reference does not fit at 8192
def test_dense_packed_pallas_matches_masked_xla(T):
    """Packed documents on the dense path through the document-local kernel (the model's choice
    on a GPU) == an explicit same-document causal mask in float32, values and gradients, bf16
    inputs: relative RMSE <= 5e-3 (issue #16)."""
    from nsa_jax.dense_packed import dense_packed_attention
    rng = np.random.default_rng(0)
    lengths = [1, 31, 64, 700, 5]
    lengths.append(T - sum(lengths))
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0), jnp.int32)
    q, k, v = (jnp.asarray(rng.standard_normal((2, T, n, 64)), jnp.bfloat16) for n in (12, 2, 2))
    ct = jnp.asarray(rng.standard_normal((2, T, 12, 64)), jnp.bfloat16)

    def run(impl, dt):
        o, vjp = jax.vjp(lambda *a: dense_packed_attention(*a, seg, impl),
                         *(x.astype(dt) for x in (q, k, v)))
        return (o,) + vjp(ct.astype(dt))

    with jax.default_matmul_precision("highest"):
        want = jax.jit(lambda: run("xla", jnp.float32))()
    for name, a, b in zip(("out", "dq", "dk", "dv"), jax.jit(lambda: run("pallas", jnp.bfloat16))(),
                          want):
        assert _rel(a, b) <= 5e-3, (name, _rel(a, b))


def _packed_lengths(T):
    """Documents of ~2k tokens plus short ones (1, < l, = l', not a multiple of l'); the last
    one is cut by the row end."""
    lengths = [1, 31, 64, 700, 5] + [2100, 1900, 2500] * (T // 8192)
    return lengths + [T - sum(lengths)]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048])   # the float32 O(T^2) reference does not fit at 8192
@pytest.mark.parametrize("cmp_attn,sel_impl", [("pallas", "auto"), ("cudnn", "auto"),
                                               ("pallas", "gather")])
def test_packed_bf16_matches_f32_reference(T, cmp_attn, sel_impl):
    """Packed documents (issue #16) through the compiled kernels: bf16 impl="pallas" with
    segment_ids against the float32 packed reference, output and all 8 gradients (125M shape,
    h=6, D=64), relative RMSE <= 5e-3; the packed selection (document-relative ids) feeds both,
    and it equals the float32 selection on at least 99% of its ids. The compressed branch by
    the packed Pallas kernels or as a grouped cuDNN attention with the documents' slot mask;
    for cuDNN its lse (which the scores take) equals the packed Pallas lse. The selection by
    the tiled kernels ("auto" at 2k) or the block-major pair ("gather": h = 6, bf16)."""
    Hq, G, D = SHAPES["125m"]
    args, cot = _inputs(T + 7, T, Hq, G, D, jnp.bfloat16)
    seg = jnp.asarray(np.repeat(np.arange(len(_packed_lengths(T))), _packed_lengths(T))[None],
                      jnp.int32)
    if cmp_attn == "cudnn":
        from nsa_jax.nsa import semantics
        from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped
        from nsa_jax.pallas.common import BlockSizes
        from nsa_jax.pallas.compressed import cmp_forward
        lay = semantics.segment_layout(seg, CFG)
        _, lse = jax.jit(lambda q, kc, vc: cmp_attention_grouped(q, kc, vc, CFG, "cudnn",
                                                                 seg=lay))(*args[:3])
        _, want = jax.jit(lambda q, kc: cmp_forward(q, kc, None, CFG, BlockSizes(),
                                                    1 / math.sqrt(D), False, seg=lay))(
            args[0], args[1])
        fin = np.isfinite(np.asarray(want))
        assert np.array_equal(fin, np.isfinite(np.asarray(lse)))
        lse_err = float(np.max(np.abs(np.asarray(lse)[fin] - np.asarray(want)[fin])))
        print("packed cmp_attn=cudnn lse max abs diff", f"{lse_err:.2e}")
        assert lse_err <= 1e-3, lse_err
    idx = jax.jit(lambda q, kc, s: select_blocks_pallas(q, kc, CFG, segment_ids=s))(
        args[0], args[1], seg)
    idx32 = ref.select_blocks(args[0][:, :, :Hq // G].astype(jnp.float32),
                              args[1][:, :, :1].astype(jnp.float32), CFG, seg)
    assert float(jnp.mean(idx[:, :, :1] == idx32)) >= 0.99
    out, grads = _pallas_fwd_bwd(args, cot, block_idx=idx, segment_ids=seg,
                                 choices=KernelChoices(cmp_attn=cmp_attn, sel_impl=sel_impl))
    ro, rgrads = _reference_by_group(args, cot, idx, G, segment_ids=seg)
    errs = {"out": _rel(out, ro)}
    errs.update({n: _rel(a, b) for n, a, b in zip(NAMES, grads, rgrads)})
    print("packed 125m", T, cmp_attn, sel_impl, {k: f"{v:.2e}" for k, v in errs.items()})
    bad = {k: v for k, v in errs.items() if not v <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("shape,T,sel", [
    ("125m", 2048, {}), ("bench", 1027, {}),
    # the per-query selection dQ kernels after cuDNN's grouped compressed backward (long T)
    ("bench", 1027, {"sel_impl": "gather"}),
    ("bench", 2048, {"sel_impl": "gather", "sel_dq": "ds"}),
    # the "repeat" head order (keys repeated d times, q reshaped: no transposes)
    ("125m", 2048, {"cmp_grouping": "repeat"}), ("bench", 1027, {"cmp_grouping": "repeat"}),
])
def test_cmp_attn_cudnn_matches_f32_reference(shape, T, sel):
    """KernelChoices(cmp_attn="cudnn"): compressed attention as a grouped causal cuDNN attention
    (its backward too); bf16 output and all 8 gradients within 5e-3 (relative RMSE) of the float32
    reference on the same selection, and cuDNN's lse (converted to base 2) equals the Pallas
    lse where a block is visible (the selection scores depend on it). ``sel``: selection
    choices (gather: the per-query dQ kernels, which the long-T default runs with it)."""
    from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped
    from nsa_jax.pallas.common import BlockSizes
    from nsa_jax.pallas.compressed import cmp_forward
    Hq, G, D = SHAPES[shape]
    args, cot = _inputs(T + 11, T, Hq, G, D, jnp.bfloat16)
    grouping = sel.get("cmp_grouping", "transpose")
    _, lse = jax.jit(lambda q, kc, vc: cmp_attention_grouped(q, kc, vc, CFG, "cudnn",
                                                             grouping=grouping))(*args[:3])
    _, want = jax.jit(lambda q, kc: cmp_forward(q, kc, None, CFG, BlockSizes(), 1 / math.sqrt(D),
                                                False))(args[0], args[1])
    fin = np.isfinite(np.asarray(want))
    assert np.array_equal(fin, np.isfinite(np.asarray(lse)))
    lse_err = float(np.max(np.abs(np.asarray(lse)[fin] - np.asarray(want)[fin])))
    idx = jax.jit(lambda q, kc: select_blocks_pallas(q, kc, CFG))(args[0], args[1])
    out, grads = _pallas_fwd_bwd(args, cot, block_idx=idx,
                                 choices=KernelChoices(cmp_attn="cudnn", **sel))
    ro, rgrads = _reference_by_group(args, cot, idx, G)
    errs = {"out": _rel(out, ro)}
    errs.update({n: _rel(a, b) for n, a, b in zip(NAMES, grads, rgrads)})
    print("cmp_attn=cudnn", shape, T, sel, f"lse max abs diff {lse_err:.2e}",
          {k: f"{v:.2e}" for k, v in errs.items()})
    assert lse_err <= 1e-3, lse_err   # same bf16 products, float32 sums: ~1e-6 expected
    bad = {k: v for k, v in errs.items() if not v <= 5e-3}
    assert not bad, f"relative RMSE above 5e-3: {bad}"
