"""Every Pallas kernel lowers to Triton for a CUDA GPU, checked on the CPU.

``jax.export`` with ``platforms=["cuda"]`` runs the Pallas -> Triton lowering (the Triton IR is
built in Python and embedded in the exported module) without a GPU, and every module it builds
is run through the MLIR verifier, as XLA's parse of it on the GPU would; PTX compilation is not
covered (the ``gpu``-marked tests do that on a device). This catches a kernel that only works
in interpret mode (an op without a Triton lowering rule, a non-power-of-two block, a bad dot
shape, a loop whose bounds differ in type) before GPU time is spent.
"""
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax._src.pallas.triton import lowering as triton_lowering

import nsa_jax.pallas.decode as pdecode
import nsa_jax.pallas.local as plocal
import nsa_jax.pallas.nsa as pnsa
from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.decoding import SYNC_SLOTS
from nsa_jax.nsa.options import KernelChoices

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import triton_ir  # noqa: E402  (the export for CUDA, compiled kernels, the op's routes)


def triton_kernels(f, *shapes) -> set[str]:
    """Names of the Triton kernels in f lowered for CUDA (raises if any kernel cannot lower or
    its module fails the MLIR verifier, run on each module as XLA's parse of it would)."""
    text = triton_ir.lower_for_cuda(f, *shapes, on_module=lambda m: m.operation.verify())
    assert triton_ir.TRITON in text
    return {part.split('"')[0] for part in text.split('name = "')[1:]}


def S(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


CFG = NSAConfig()
B, T, G, h, D = 1, 1024, 2, 6, 64


@pytest.mark.parametrize("route", list(triton_ir.ROUTES))
def test_nsa_kernels_lower_to_triton(route):
    # The routes: bf16 packed rows (scoring / top-n / selection / the local window) through the
    # tiled, block-major and query-major selection; float32 (the local kernel's window) through
    # the same three. cmp_attn="pallas": the compressed kernels (cuDNN, which "cudnn" would take,
    # cannot lower without a GPU; the gpu tests cover it). sel_dq follows sel_fwd: "block" lowers
    # the block-major forward and the fused dK/dV + dQ backward, "query" the per-query kernels.
    _, _, sel_impl, sel_fwd = triton_ir.ROUTES[route]
    f, shapes = triton_ir.route(route)
    names = triton_kernels(f, *shapes)
    assert {"nsa_local_fwd", "nsa_local_bwd_dq", "nsa_local_bwd_dkv"} <= names, names
    if sel_impl == "tiled":
        want = {"nsa_sel_tiled_fwd", "nsa_sel_tiled_bwd_dq", "nsa_sel_tiled_bwd_dkv"}
    elif sel_fwd == "block":
        want = {"nsa_sel_fwd_block", "nsa_sel_bwd_block"}
    else:
        want = {"nsa_sel_fwd", "nsa_sel_bwd_dq", "nsa_sel_bwd_dkv"}
    assert want <= names, names
    if sel_fwd == "block":
        assert not {"nsa_sel_fwd", "nsa_sel_bwd_dq", "nsa_sel_bwd_dkv"} & names, names


def test_query_major_sub_tile_steps_lower_to_triton():
    """The query-major forward and dQ walking 32-key steps of each 64-key block
    (``BlockSizes.sel_q_keys``) in a 4-stage pipeline (packed bf16 rows: the unpacked window
    branch is cuDNN's, which does not lower without a GPU)."""
    from nsa_jax.pallas import BlockSizes
    f, shapes = triton_ir.route("bf16-packed-query",
                                block_sizes=BlockSizes(sel_q_keys=32, sel_stages=4))
    names = triton_kernels(f, *shapes)
    assert {"nsa_sel_fwd", "nsa_sel_bwd_dq"} <= names, names


def test_bench_shape_backward_tiles_lower_to_triton():
    """The tiles ``BlockSizes.for_shape`` gives bf16 128-wide heads (h = 16): the Pallas compressed
    backward at 64 rows and 4 warps (``cmp_bwd_rows``; ``cmp_bwd_warps`` unset, so ``num_warps``),
    the inverted selection dK/dV kernel at 64 rows and 4 warps and the per-query kernels' 32-key
    steps at one warp."""
    from nsa_jax.pallas import BlockSizes
    from nsa_jax.pallas.compressed import cmp_backward
    from nsa_jax.pallas.selection import sel_backward, sel_forward
    Hq, Gb, Db, bf = 16, 1, 128, jnp.bfloat16
    bs = BlockSizes.for_shape(Hq // Gb, Db)
    assert (bs.cmp_bwd_rows, bs.cmp_bwd_warps or bs.num_warps, bs.sel_rows,
            bs.sel_bwd_warps or bs.num_warps) == (64, 4, 64, 4)
    Tc = CFG.num_cmp_blocks(T)

    def f(q, kc, vc, k, v, idx, do):
        cmp = cmp_backward(q, kc, vc, do.astype(jnp.float32), jnp.zeros(q.shape[:3]), do, None,
                           None, CFG, bs, 0.1, False)
        o, lse = sel_forward(q, k, v, idx, CFG, bs, 0.1, False)
        return cmp, sel_backward(q, k, v, idx, o, lse, do, None, CFG, bs, 0.1, False)
    names = triton_kernels(f, S(B, T, Hq, Db, dtype=bf), S(B, Tc, Gb, Db, dtype=bf),
                           S(B, Tc, Gb, Db, dtype=bf), S(B, T, Gb, Db, dtype=bf),
                           S(B, T, Gb, Db, dtype=bf), S(B, T, Gb, CFG.n_sel, dtype=jnp.int32),
                           S(B, T, Hq, Db, dtype=bf))
    assert {"nsa_cmp_bwd_dq", "nsa_cmp_bwd_dkv_split", "nsa_sel_fwd", "nsa_sel_bwd_dq",
            "nsa_sel_bwd_dkv"} <= names, names


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_ds_backward_lowers_to_triton(dtype):
    """The selection backward with ``sel_dq="ds"`` at the bench shape's group (h = 16, D = 128,
    the tiles ``BlockSizes.for_shape`` gives it): the inverted dK/dV kernel storing dS in entry
    order and the dQ-from-dS kernel, and no per-query dQ kernel."""
    from nsa_jax.pallas import BlockSizes
    from nsa_jax.pallas.selection import sel_backward
    Hq, Gb, Db = 16, 1, 128
    bs = BlockSizes.for_shape(Hq // Gb, Db, jnp.dtype(dtype).itemsize)
    ch = KernelChoices(sel_impl="gather", sel_dq="ds")

    def f(q, k, v, idx, o, lse, do):
        return sel_backward(q, k, v, idx, o, lse, do, None, CFG, bs, 0.1, False, choices=ch)
    names = triton_kernels(f, S(B, T, Hq, Db, dtype=dtype), S(B, T, Gb, Db, dtype=dtype),
                           S(B, T, Gb, Db, dtype=dtype), S(B, T, Gb, CFG.n_sel, dtype=jnp.int32),
                           S(B, T, Hq, Db, dtype=jnp.float32), S(B, T, Hq, dtype=jnp.float32),
                           S(B, T, Hq, Db, dtype=dtype))
    assert {"nsa_sel_bwd_dkv", "nsa_sel_bwd_dq_ds"} <= names, names
    assert "nsa_sel_bwd_dq" not in names, names


@pytest.mark.parametrize("layout,sel_block", [("rows", 64), ("loop", 64), ("loop", 48)])
def test_scoring_layouts_lower_to_triton(layout, sel_block):
    """Both scoring tile layouts (``KernelChoices.score_heads``), the loop one on the fast path
    (l'/d = 4) and the general path (l'/d = 3: float32 dots)."""
    cfg = NSAConfig(sel_block=sel_block)
    Tc = cfg.num_cmp_blocks(T)
    names = triton_kernels(
        lambda q, kc: pnsa.block_scores_pallas(q, kc, cfg,
                                               choices=KernelChoices(score_heads=layout)),
        S(B, T, G * h, D), S(B, Tc, G, D))
    assert "nsa_cmp_scores" in names, names


@pytest.mark.parametrize("window", [512, None])
def test_local_kernels_lower_to_triton(window):
    def f(q, k, v, start):
        o, vjp = jax.vjp(lambda *a: plocal.local_attention(*a, start, window, interpret=False),
                         q, k, v)
        return o, vjp(o)
    names = triton_kernels(f, S(2, 777, 12, 64), S(2, 777, 2, 64), S(2, 777, 2, 64),
                           S(2, 777, dtype=jnp.int32))
    assert names == {"nsa_local_fwd", "nsa_local_bwd_dq", "nsa_local_bwd_dkv"}, names


def test_decode_kernels_lower_to_triton():
    Tc, W, N = CFG.num_cmp_blocks(4096), CFG.window, 4096
    kv = {"k_cmp": S(4, G, Tc, D), "v_cmp": S(4, G, Tc, D), "k_slc": S(4, G, N, D),
          "v_slc": S(4, G, N, D), "k_win": S(4, G, W, D), "v_win": S(4, G, W, D)}
    names = triton_kernels(lambda q, kv, t, g: pdecode.nsa_decode_pallas(q, kv, t, g, CFG),
                           S(4, G * h, D), kv, S(4, dtype=jnp.int32), S(4, G * h, 3))
    assert len(names) >= 4, names
    # the gates as logits of the fused step projection, their sigmoid in the finishing kernel
    from nsa_jax.pallas.cache_write import Columns

    def f(q, kv, t, P, bias):
        gl = pdecode.GateLogits(Columns(P, 7, (3 * G * h,)), bias, jnp.bfloat16)
        return pdecode.nsa_decode_pallas(q, kv, t, gl, CFG)
    assert "nsa_decode_finish" in triton_kernels(f, S(4, G * h, D), kv, S(4, dtype=jnp.int32),
                                                 S(4, 7 + 3 * G * h), S(3 * G * h))


def test_phi_emission_kernel_lowers_to_triton():
    """The decode step's φ + RoPE + compressed-cache write (``pallas.phi_decode``), 125M shape,
    B*G = 130 rows (a partial row tile)."""
    from nsa_jax.pallas.phi_decode import emit_pallas
    Bq, L, H, Tc = 65, CFG.block_l, 4 * D, 4096
    phi = (S(L, D, dtype=jnp.float32), S(L * D, H), S(H), S(H, D), S(D))

    def f(kc, vc, kb, vb, idx, cs, pk, pv):
        return emit_pallas(kc, vc, kb, vb, idx, cs, cs, pk, pv, interpret=False)
    names = triton_kernels(f, S(Bq, G, Tc, D), S(Bq, G, Tc, D), S(Bq, G, L, D), S(Bq, G, L, D),
                           S(Bq, dtype=jnp.int32), S(Bq, D // 2, dtype=jnp.float32), phi, phi)
    assert names == {"nsa_decode_phi_h", "nsa_decode_phi_out"}, names

    def fused(kc, vc, kb, vb, idx, cs, pk, pv, sync):      # one launch: the completion counters
        return emit_pallas(kc, vc, kb, vb, idx, cs, cs, pk, pv, interpret=False, sync=sync)
    names = triton_kernels(fused, S(Bq, G, Tc, D), S(Bq, G, Tc, D), S(Bq, G, L, D),
                           S(Bq, G, L, D), S(Bq, dtype=jnp.int32), S(Bq, D // 2, dtype=jnp.float32),
                           phi, phi, S(Bq, G, SYNC_SLOTS, dtype=jnp.int32))
    assert names == {"nsa_decode_phi"}, names
    # the completion counter orders the programs' stores: it keeps jax's acquire-release atomic
    # (pallas.atomics: only accumulators are relaxed)
    assert _atomics(lambda *a: fused(*a), S(Bq, G, Tc, D), S(Bq, G, Tc, D), S(Bq, G, L, D), S(Bq, G, L, D),
                    S(Bq, dtype=jnp.int32), S(Bq, D // 2, dtype=jnp.float32), phi, phi,
                    S(Bq, G, SYNC_SLOTS, dtype=jnp.int32)) == {"nsa_decode_phi": {"acq_rel"}}


def _atomics(f, *shapes) -> dict[str, set[str]]:
    """kernel name -> the memory semantics of its ``tt.atomic_rmw`` ops (kernels with any). ``f``
    must not have been lowered before (a cached lowering builds no module)."""
    modules = []
    triton_ir.lower_for_cuda(
        f, *shapes, on_module=lambda m: modules.append(m.operation.get_asm(enable_debug_info=False)))
    out = {}
    for text in modules:
        for part in text.split("tt.func public @")[1:]:
            sems = set(re.findall(r"atomic_rmw \w+, (\w+),", part))
            if sems:
                out[part.split("(")[0]] = sems
    return out


@pytest.mark.parametrize("route", ["f32-block", "bf16-packed-query"])
def test_accumulator_atomics_are_relaxed(route):
    """The dK/dV tiles that programs add into float32 accumulators go through
    ``pallas.atomics.add``: relaxed atomics (jax's ``atomic_add`` is acquire-release, which sm_90
    code brackets with a GPU-wide fence and an L1 invalidation per vector; bench/NOTES.md,
    fortieth session). The block-major fused backward, the inverted dK/dV and the compressed
    branch's split dK/dV."""
    f, shapes = triton_ir.route(route)
    sel = "nsa_sel_bwd_block" if route == "f32-block" else "nsa_sel_bwd_dkv"
    assert _atomics(f, *shapes) == {sel: {"relaxed"}, "nsa_cmp_bwd_dkv_split": {"relaxed"}}


def test_query_major_atomic_dkv_is_relaxed():
    """``sel_bwd="atomic"``: the per-query kernel (dQ with atomic dK/dV) adds each step's dK/dV tiles (relaxed)."""
    f, shapes = triton_ir.route("f32-query", choices={"sel_bwd": "atomic"})
    assert _atomics(f, *shapes)["nsa_sel_bwd_atomic"] == {"relaxed"}


def test_cache_write_kernel_lowers_to_triton():
    from nsa_jax.pallas.cache_write import write_rows_pallas
    Bq, N, W, L = 8, 4096, CFG.window, CFG.block_l
    bufs = (S(Bq, G, N, D), S(Bq, G, N, D), S(Bq, G, W, D), S(Bq, G, W, D), S(Bq, G, L, D),
            S(Bq, G, L, D))

    def f(bufs, rows, t):
        return write_rows_pallas(bufs, rows, (t, t, t % W, t % W, t % L, t % L), ring=(4, 5),
                                 ring_start=t - (L - 1), interpret=False)
    names = triton_kernels(f, bufs, tuple(S(Bq, G, D) for _ in range(6)), S(Bq, dtype=jnp.int32))
    assert names == {"nsa_cache_write"}, names
    # the decode step's form: one [B,6,G,D] stack in cache_update.ROWS order, keys and the
    # group's queries rotated in the kernel
    def g(bufs, rows, t, cs, q):
        return write_rows_pallas(bufs, (rows, (2, 3, 4, 5, 0, 1)),
                                 (t, t, t % W, t % W, t % L, t % L), ring=(4, 5),
                                 ring_start=t - (L - 1), rope=(cs, cs, (0, 2)), q=q,
                                 interpret=False)
    names = triton_kernels(g, bufs, S(Bq, 6, G, D), S(Bq, dtype=jnp.int32),
                           S(Bq, D // 2, dtype=jnp.float32), S(Bq, G * h, D))
    assert names == {"nsa_cache_write"}, names
    # the fused step projection's form: q and the stack as Columns of one [B, W] array
    from nsa_jax.pallas.cache_write import Columns
    nq = G * h * D

    def k(bufs, P, t, cs):
        return g(bufs, Columns(P, nq, (6, G, D)), t, cs, Columns(P, 0, (G * h, D)))
    names = triton_kernels(k, bufs, S(Bq, nq + 6 * G * D + 3 * G * h), S(Bq, dtype=jnp.int32),
                           S(Bq, D // 2, dtype=jnp.float32))
    assert names == {"nsa_cache_write"}, names


def test_topn_kernel_lowers_to_triton():
    """Top-n at T = 32k (Ts = 512): every width bucket from 16 to 512 columns lowers, the
    512-column one through the tournament kernel."""
    from nsa_jax.pallas import topn
    T = 32768
    Ts = CFG.num_sel_blocks(T)
    assert topn._tournament(Ts, T // 2, Ts, CFG, False)
    names = triton_kernels(lambda s: topn.topn_pallas(s, CFG, False), S(1, T, G, Ts,
                                                                         dtype=jnp.float32))
    assert names == {"nsa_topn"}, names


def test_chunk_kernels_lower_to_triton():
    """A chunked prefill's continuation chunk (``pallas.chunk``, 125M heads, 1,024 queries at
    start 4,096 over 64k caches): the compressed forward, scores, top-n (the tournament over
    2,048 columns with its first pass bounded on the device), the selection forward
    (block-major, what "auto" takes at h = 6 in bf16, and query-major) and the local forward
    with query offsets lower; and dense's local forward. cmp_attn="pallas": over a 64k cache
    "auto" takes cuDNN for the compressed attention, which cannot lower without a GPU (the GPU
    tests cover it: tests/test_chunk_cmp_grouped.py)."""
    from nsa_jax.nsa.options import KernelChoices
    from nsa_jax.pallas.chunk import dense_chunk_pallas, nsa_chunk_pallas
    C, Sk, W = 1024, 65536, CFG.window
    Tc = CFG.num_cmp_blocks(Sk)
    shapes = (S(B, C, G * h, D), S(B, G, Tc, D), S(B, G, Tc, D), S(B, G, Sk, D), S(B, G, Sk, D),
              S(B, G, W + C, D), S(B, G, W + C, D), S(B, C, G * h, 3))
    for sel_fwd, sel_name in (("auto", "nsa_sel_fwd_block"), ("query", "nsa_sel_fwd")):
        def f(q, kc, vc, ks, vs, kw, vw, gates):
            lc = {"k_cmp": kc, "v_cmp": vc, "k_slc": ks, "v_slc": vs}
            t = 4096 + jnp.arange(C)
            return nsa_chunk_pallas(q, lc, (kw, vw, t[0] - W + jnp.arange(W + C)), t, gates,
                                    CFG, choices=KernelChoices(sel_fwd=sel_fwd,
                                                               cmp_attn="pallas"))
        names = triton_kernels(f, *shapes)
        assert names == {"nsa_cmp_fwd", "nsa_cmp_scores", "nsa_topn_upto", sel_name,
                         "nsa_local_fwd"}, names
    names = triton_kernels(lambda q, k, v: dense_chunk_pallas(q, k, v, 4096 + jnp.arange(C)),
                           S(B, C, G * h, D), S(B, G, Sk, D), S(B, G, Sk, D))
    assert names == {"nsa_local_fwd"}, names


def test_bench_triton_ir_is_location_free_and_repeatable():
    """bench/triton_ir.py's premise: the IR it writes names every kernel of a route, carries no
    source locations (a code move alone must not change it) and is the same on a second lowering,
    so byte-identical files before and after a refactor mean the same kernels."""
    hooks = (pnsa.use_interpret, plocal.use_interpret, pdecode.use_interpret,
             triton_lowering.lower_jaxpr_to_triton_module)
    first = triton_ir.route_ir("bf16-packed-tiled")
    assert "loc(" not in first
    names = {part.split("(")[0] for part in first.split("tt.func public @")[1:]}
    assert {"nsa_sel_tiled_fwd", "nsa_sel_tiled_bwd_dq", "nsa_sel_tiled_bwd_dkv",
            "nsa_local_bwd_dkv", "nsa_cmp_bwd_dq", "nsa_topn"} <= names, names
    assert triton_ir.route_ir("bf16-packed-tiled") == first
    # the tool puts back what it patched
    assert (pnsa.use_interpret, plocal.use_interpret, pdecode.use_interpret,
            triton_lowering.lower_jaxpr_to_triton_module) == hooks


def _triton_builds(f, *shapes) -> int:
    """How many Triton modules lowering jit(f) for CUDA builds."""
    n = [0]

    def count(_):
        n[0] += 1
    triton_ir.lower_for_cuda(f, *shapes, on_module=count)
    return n[0]


def test_layers_lower_each_kernel_once():
    """The op, a prefill chunk and a decode step are jitted functions of their own
    (``pallas.nsa._nsa_once``, ``pallas.chunk._chunk_once``, ``pallas.decode._decode_once``):
    three layers of equal shapes (the op forward and backward) build as many Triton modules as
    one layer, not three times as many (bench/NOTES.md, fifty-second session: 168 -> 14 builds
    for 12 layers of the 125M op's gradient at 8k)."""
    from nsa_jax.pallas.chunk import nsa_chunk_pallas
    f1, shapes = triton_ir.route("f32-block")

    def stack(n):
        def f(q, *rest):
            tot = 0.0
            for _ in range(n):
                o = f1(q, *rest)
                q = (q + 0.5 * o[0]).astype(q.dtype)
                tot = tot + o[0]
            return tot
        return f
    one, three = _triton_builds(stack(1), *shapes), _triton_builds(stack(3), *shapes)
    assert one >= 5 and three == one, (one, three)

    C, Sk, W = 256, 4096, CFG.window
    Tc = CFG.num_cmp_blocks(Sk)
    cshapes = (S(B, C, G * h, D), S(B, G, Tc, D), S(B, G, Tc, D), S(B, G, Sk, D),
               S(B, G, Sk, D), S(B, G, W + C, D), S(B, G, W + C, D), S(B, C, G * h, 3))

    def chunks(n):
        def f(q, kc, vc, ks, vs, kw, vw, gates):
            lc = {"k_cmp": kc, "v_cmp": vc, "k_slc": ks, "v_slc": vs}
            t = 1024 + jnp.arange(C)
            for _ in range(n):
                q = nsa_chunk_pallas(q, lc, (kw, vw, t[0] - W + jnp.arange(W + C)), t, gates,
                                     CFG, choices=KernelChoices(cmp_attn="pallas"))
            return q
        return f
    one, three = _triton_builds(chunks(1), *cshapes), _triton_builds(chunks(3), *cshapes)
    assert one >= 4 and three == one, (one, three)

    f1, dshapes = triton_ir.decode_route("125m", 4096, 2)     # the decode step (pallas.decode)

    def steps(n):
        def f(q, *a):
            for _ in range(n):
                q = (q + f1(q, *a)).astype(q.dtype)
            return q
        return f
    one, three = _triton_builds(steps(1), *dshapes), _triton_builds(steps(3), *dshapes)
    assert one >= 4 and three == one, (one, three)
