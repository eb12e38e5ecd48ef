"""``nsa_attention_pallas``: NSA attention (Eq. 5) from the Pallas kernels.

Branches: compressed attention (``compressed``), block selection from the fused scores
(``scoring.cmp_block_scores`` + ``topn.topn_pallas``), selected-block attention
(``selection``) and the sliding window (``window``), gated and summed like the reference
(``semantics.combine``). Kernels run compiled on a GPU and through
the Pallas interpreter elsewhere (``jax.default_backend()``).

Packed documents (``segment_ids``, issue #16): the :class:`semantics.SegmentLayout`
(``start``, ``rel``, ``cmp_lo`` [B,T] and per-slot ``cmp_src``/``cmp_ok``; O(T), no [T, T]
mask) goes to every kernel, which then applies each rule in document-relative coordinates:
compressed fwd/bwd and scoring see slot i iff 0 <= i - lo and (i - lo)*d + l - 1 <= r (Eq. 8),
top-n takes r as the position (Eq. 11, document-relative ids), the selection kernels keep key s
of block j where start + j*l' <= s < start + (j+1)*l' and start <= s <= t (Eq. 12 per
document; the gather kernels load the block at start + j*l', the block-major ones list it once
under an l'-key range that holds it: ``selection``, the tiled ones walk the one or two aligned
blocks it overlaps: ``selection_tiled``), the window (the document-local kernel,
``local.py``) keeps s >= start. Both selection
implementations take packed rows, picked by ``KernelChoices.sel_impl`` as for unpacked ones.
``segment_ids=None`` passes no layout and compiles exactly the unpacked kernels (packing is a
static switch).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import SEL_FWD_BLOCK_MAX_H, KernelChoices
from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped
from nsa_jax.pallas.common import (BlockSizes, choices_or_default, cudnn_applies, pad_dim,
                                   padded_dims, require_cudnn, stored_dtype,
                                   use_interpret)
from nsa_jax.pallas.compressed import cmp_backward, cmp_forward
from nsa_jax.pallas.scoring import cmp_block_scores
from nsa_jax.pallas.selection import atomic_mode, sel_backward, sel_forward
from nsa_jax.pallas.selection_block import sel_backward_block, sel_forward_block
from nsa_jax.pallas.selection_tiled import sel_tiled_backward, sel_tiled_forward
from nsa_jax.pallas import mosaic_common, mosaic_tiled, mosaic_tiled_dkv, mosaic_tiled_dq
from nsa_jax.pallas.topn import topn_pallas
from nsa_jax.pallas.window import window_attention, xla_precision


def _block_sizes(q, G: int, block_sizes):
    if block_sizes is not None:
        if not isinstance(block_sizes, BlockSizes):
            raise TypeError(f"block_sizes must be a BlockSizes, got {type(block_sizes).__name__}")
        return block_sizes
    return BlockSizes.for_shape(q.shape[2] // G, q.shape[-1], jnp.dtype(q.dtype).itemsize)


def _layout(segment_ids, cfg: NSAConfig):
    """None, segment ids [B,T] or a SegmentLayout -> None or a SegmentLayout (int32 fields)."""
    if segment_ids is None or isinstance(segment_ids, semantics.SegmentLayout):
        return segment_ids
    return semantics.segment_layout(jnp.asarray(segment_ids, jnp.int32), cfg)


def block_scores_pallas(q, k_cmp, cfg: NSAConfig, block_sizes: BlockSizes | None = None, *,
                        choices: KernelChoices | None = None, segment_ids=None):
    """Selection-block scores [B,T,G,Ts] (Eq. 9-10), computed without materialising p_cmp
    (over each query's document-relative blocks with ``segment_ids``)."""
    q = jax.lax.stop_gradient(q)
    k_cmp = jax.lax.stop_gradient(k_cmp)
    G, Dk = k_cmp.shape[2], q.shape[-1]
    bs = _block_sizes(q, G, block_sizes)
    interpret = use_interpret()
    Dkp, _ = padded_dims(Dk, Dk)
    qp, kp = pad_dim(q, Dkp), pad_dim(k_cmp, Dkp)
    scale = 1.0 / math.sqrt(Dk)
    seg = _layout(segment_ids, cfg)
    _, lse = cmp_forward(qp, kp, None, cfg, bs, scale, interpret, choices=choices, seg=seg)
    return cmp_block_scores(qp, kp, lse, cfg, bs, scale, interpret, choices=choices, seg=seg)


def select_blocks_pallas(q, k_cmp, cfg: NSAConfig, block_sizes: BlockSizes | None = None, *,
                         choices: KernelChoices | None = None, segment_ids=None):
    """Selected block ids int32 [B,T,G,n_sel], ascending, -1 padded (== the reference's
    ``select_blocks``; document-relative ids with ``segment_ids``)."""
    seg = _layout(segment_ids, cfg)
    scores = block_scores_pallas(q, k_cmp, cfg, block_sizes, choices=choices, segment_ids=seg)
    return topn_pallas(scores, cfg, use_interpret(), None if seg is None else seg.rel,
                       _block_sizes(q, k_cmp.shape[2], block_sizes))


def _small(h: int | None, dtype) -> bool:
    """Groups where "auto" takes the block-major forward: h <= ``SEL_FWD_BLOCK_MAX_H`` heads
    and a 16-bit dtype (either None: unknown, so no)."""
    return (h is not None and h <= SEL_FWD_BLOCK_MAX_H and dtype is not None
            and jnp.dtype(dtype).itemsize == 2)


def block_forward(choices: KernelChoices | None, h: int | None, dtype) -> bool:
    """The gather forward is the block-major one (``sel_forward_block``): ``choices.sel_fwd``
    "block", or "auto" on a group of ``_small`` heads (``selection_kernels``)."""
    ch = choices_or_default(choices)
    return ch.sel_fwd == "block" or (ch.sel_fwd == "auto" and _small(h, dtype))


def selection_kernels(choices: KernelChoices | None, T: int, h: int | None = None,
                      dtype=None):
    """(forward, backward) of the selection branch by ``choices.sel_impl``: "auto" takes the
    tiled (block-sparse flash) kernels up to ``choices.sel_tiled_max_t`` tokens, the gather ones
    above, for unpacked and packed rows alike. Both share one contract: ``fwd(q, k, v, idx, cfg,
    bs, scale, interpret, choices=, seg=) -> (o, lse)`` and ``bwd(q, k, v, idx, o, lse, do, gs,
    cfg, bs, scale, interpret, choices=, seg=) -> (dq, dk, dv)`` (``seg``: packed rows' layout,
    None = unpacked; module docstring). The gather forward follows ``choices.sel_fwd`` ("query"
    or "block"; the tiled kernels ignore it); "auto" takes "block" only where it was measured
    faster: groups of ``h`` <= 8 heads and a 16-bit ``dtype`` (h or dtype None = unknown:
    "query"), for packed rows as for unpacked ones (their index lists each selected block once,
    ``selection`` module docstring; measured in bench/NOTES.md, eighth session). The gather
    backward's dQ follows ``choices.sel_dq``: "auto" takes the fused block-major backward
    (``sel_backward_block``) where the forward resolved to "block" under the same rule and
    ``sel_bwd`` is "inverted" (the two share one index), else ``sel_backward`` (its per-query dQ
    kernel, or with "ds" dQ from the dK/dV kernel's stored dS)."""
    ch = choices_or_default(choices)
    tiled = ch.sel_impl == "tiled" or (ch.sel_impl == "auto" and T <= ch.sel_tiled_max_t)
    if tiled:
        return sel_tiled_forward, sel_tiled_backward
    block = block_forward(ch, h, dtype)
    block_dq = ch.sel_dq == "block" or (ch.sel_dq == "auto" and block and _small(h, dtype)
                                        and not atomic_mode(ch))
    return ((sel_forward_block if block else sel_forward),
            (sel_backward_block if block_dq else sel_backward))


def tiled_backend(key: str, choices: KernelChoices | None, q, k, v, cfg: NSAConfig, seg,
                  interpret: bool) -> str:
    """``KernelChoices.<key>`` (``sel_tiled_fwd``, ``sel_tiled_dq``, ``sel_tiled_dkv``) resolved
    for these operands: "mosaic" or "triton". "auto" takes the Mosaic GPU kernel where it runs
    (``mosaic_common.mosaic_unsupported``) and was measured faster (``mosaic_common.
    AUTO_MIN_HEAD_DIM``: the forward and dQ at 128-wide heads, dK/dV at 64 and 128); an
    explicit "mosaic" where it cannot run is one error naming the key and the reason."""
    want = getattr(choices_or_default(choices), key)
    if want == "triton":
        return "triton"
    why = mosaic_common.mosaic_unsupported(q, k, v, cfg, seg, interpret)
    if why is None and (want == "mosaic" or q.shape[-1] >= mosaic_common.AUTO_MIN_HEAD_DIM[key]):
        return "mosaic"
    if want == "mosaic":
        raise ValueError(f"kernel.{key}: 'mosaic' cannot run here: {why}; use 'triton' or "
                         f"'auto'")
    return "triton"


@dataclasses.dataclass(frozen=True)
class _Static:
    cfg: NSAConfig
    bs: BlockSizes
    choices: KernelChoices
    interpret: bool
    select: bool  # compute the selection (else block ids are an input)


def nsa_attention_pallas(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg: NSAConfig,
                         block_idx=None, block_sizes: BlockSizes | None = None, *,
                         choices: KernelChoices | None = None, segment_ids=None):
    """NSA attention output [B,T,Hq,Dv] in q's dtype; same contract as
    ``reference.nsa_attention_reference`` (``block_idx`` overrides the selection).

    One custom VJP spans the three branches and the gated sum (Eq. 5): the output cotangent
    reaches every kernel in its own dtype with the gate applied in float32 inside, and dQ is
    summed over branches in float32 and rounded once (inside the compressed and tiled selection
    dQ kernels where they run, ``_nsa_bwd``). The branch outputs are summed in float32;
    the copies saved for the backward (rowsum(O * dO) and the gate gradients) are kept in q's
    dtype when it is 16-bit (``common.stored_dtype``: half the residual bytes, as cuDNN keeps
    its O), float32 otherwise. ``block_sizes``: tiles (None = by shape);
    ``choices``: algorithms (None = ``KernelChoices()``). ``segment_ids``: int32 [B,T] packed
    documents (or their ``semantics.SegmentLayout``); module docstring.
    """
    B, T, _, _ = q.shape
    G = k_slc.shape[2]
    st = _Static(cfg, _block_sizes(q, G, block_sizes), choices_or_default(choices),
                 use_interpret(), block_idx is None)
    if block_idx is None:
        idx = jnp.zeros((B, T, G, 0), jnp.int32)  # placeholder; the forward selects
    else:
        # one partial per slot in the kernels: a repeated id would count its block twice
        idx = semantics.distinct_ids(jax.lax.stop_gradient(jnp.asarray(block_idx, jnp.int32)))
    seg = _layout(segment_ids, cfg)
    if seg is not None:
        seg = jax.tree_util.tree_map(jax.lax.stop_gradient, seg)
    return _nsa_once(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, idx, seg, st)


def _cmp_attn(q, v_cmp, st: _Static, packed: bool) -> str:
    """``KernelChoices.cmp_attn`` resolved: "auto" -> "cudnn" where cuDNN applies to unpacked
    rows longer than ``cmp_pallas_max_t``, else "pallas" (packed rows: the grouped cuDNN path
    with its document mask measured slower in the whole op; short rows: cuDNN's fixed costs,
    bench/NOTES.md); an explicit "cudnn" that cannot run is one error naming the key."""
    c = st.choices.cmp_attn
    if c == "auto":
        long_rows = q.shape[1] > st.choices.cmp_pallas_max_t
        ok = cudnn_applies(q, v_cmp, st.interpret)
        return "cudnn" if ok and not packed and long_rows else "pallas"
    if c == "cudnn":
        require_cudnn("cmp_attn", q, v_cmp, st.interpret, "'pallas' or 'xla'")
    return c


@functools.partial(jax.custom_vjp, nondiff_argnums=(10,))
def _nsa(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, idx, seg, st: _Static):
    return _nsa_fwd(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, idx, seg, st)[0]


# The op as its own jitted function (st, which holds the interpret flag, is its static key):
# a model's layers call it with equal shapes and statics, so a step traces it, and lowers each
# of its Pallas kernels to Triton, once instead of once per layer. XLA inlines the calls before
# it optimises, so the compiled step should be the same (no call is left on the CPU; the GPU
# step time is not yet measured). bench/NOTES.md, fifty-second session.
_nsa_once = jax.jit(_nsa, static_argnums=(10,))


def _nsa_fwd(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, idx, seg, st: _Static):
    cfg, bs, interpret = st.cfg, st.bs, st.interpret
    Dk, Dv = q.shape[-1], v_slc.shape[-1]
    Dkp, Dvp = padded_dims(Dk, Dv)
    scale = 1.0 / math.sqrt(Dk)
    qp, kcp = pad_dim(q, Dkp), pad_dim(k_cmp, Dkp)
    br = cfg.branches
    o_cmp = o_slc = o_win = None
    res = {}
    cmp_attn = _cmp_attn(q, v_cmp, st, seg is not None) if "cmp" in br else "pallas"
    if cmp_attn != "pallas":   # compressed attention as grouped causal attention (cmp_grouped)
        o_cmp, cmp_vjp, lse_c = jax.vjp(
            lambda a, b, c: cmp_attention_grouped(a, b, c, cfg, cmp_attn,
                                                  xla_precision(st.choices), seg,
                                                  st.choices.cmp_grouping),
            q, k_cmp, v_cmp, has_aux=True)
        res["cmp_grouped"] = (o_cmp, cmp_vjp)
    elif "cmp" in br or ("slc" in br and st.select):
        vcp = pad_dim(v_cmp, Dvp) if "cmp" in br else None
        o_c, lse_c = cmp_forward(qp, kcp, vcp, cfg, bs, scale, interpret, choices=st.choices,
                                 seg=seg)
        if "cmp" in br:
            o_cmp = o_c[..., :Dv]
            res["cmp"] = (o_c.astype(stored_dtype(q.dtype)), lse_c)
    if "slc" in br:
        if st.select:
            idx = topn_pallas(cmp_block_scores(qp, kcp, lse_c, cfg, bs, scale, interpret,
                                               choices=st.choices, seg=seg), cfg, interpret,
                              None if seg is None else seg.rel, bs)
        sel_fwd = selection_kernels(st.choices, q.shape[1], q.shape[2] // k_slc.shape[2],
                                    q.dtype)[0]
        kw = {"return_index": True} if sel_fwd is sel_forward_block else {}
        ksp, vsp = pad_dim(k_slc, Dkp), pad_dim(v_slc, Dvp)
        if sel_fwd is sel_tiled_forward and tiled_backend(
                "sel_tiled_fwd", st.choices, qp, ksp, vsp, cfg, seg, interpret) == "mosaic":
            sel_fwd = mosaic_tiled.sel_tiled_forward_mosaic
        o_s, lse_s, *index = sel_fwd(qp, ksp, vsp, idx, cfg, bs, scale, interpret,
                                     choices=st.choices, seg=seg, **kw)
        o_slc = o_s[..., :Dv]
        # index: the block forward's, for the backward; o_s kept in q's dtype if 16-bit
        res["slc"] = (idx, o_s.astype(stored_dtype(q.dtype)), lse_s, index)
    if "win" in br:
        o_win, win_vjp = jax.vjp(lambda a, b, c: window_attention(
            a, b, c, cfg, interpret, choices=st.choices, seg=seg, block_sizes=bs), q, k_win, v_win)
        res["win"] = (o_win, win_vjp)
    out = semantics.combine(o_cmp, o_slc, o_win, gates, cfg, q.dtype)
    return out, (q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, seg, res)


def _gate_sum(o, dout32):
    """dL/dg_c = sum_d o_c * dO for one branch (Eq. 5), [B,T,Hq] float32, kept out of the final
    ``jnp.stack`` by an optimization barrier: left to XLA, the sums were fused into that
    concatenate, one thread per output walking its row (0.21 ms per layer on an H200 at 2k / 8k
    with the compressed sum alone; bench/NOTES.md, seventh and twenty-first sessions)."""
    return jax.lax.optimization_barrier(jnp.sum(o * dout32, axis=-1))


def _add(dq, part, Dkp: int):
    """dq + one branch's dQ (padded to Dkp), in float32 by XLA (None = nothing yet)."""
    part = pad_dim(part.astype(jnp.float32), Dkp)
    return part if dq is None else dq + part


def _nsa_bwd(st: _Static, resid, dout):
    """The three branches' backward. dQ is chained where a kernel takes the dQ so far as its
    ``dq_in`` (the Pallas compressed dQ, the Triton tiled selection dQ): window (cuDNN or other)
    -> compressed -> selection, each adding its own in float32 and the last storing q's dtype,
    so no [B,T,Hq,Dk] float32 sum of the three is written and read (1.18 ms per 2k / B=16 step
    on an H100; bench/NOTES.md, thirty-third and thirty-fourth sessions); the other kernels'
    dQ are added by XLA in float32. Either way dQ is rounded once."""
    cfg, bs, interpret = st.cfg, st.bs, st.interpret
    q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, seg, res = resid
    Dk, Dv = q.shape[-1], v_slc.shape[-1]
    Dkp, Dvp = padded_dims(Dk, Dv)
    scale = 1.0 / math.sqrt(Dk)
    qp, dop = pad_dim(q, Dkp), pad_dim(dout, Dvp)
    g = gates.astype(jnp.float32)
    dout32 = dout.astype(jnp.float32)
    dgates = [jnp.zeros(q.shape[:3], jnp.float32) for _ in range(3)]
    dq = None   # float32 [B,T,Hq,Dkp] so far, or a window dQ not yet added (chain start)
    zeros = [jnp.zeros_like(x) for x in (k_cmp, v_cmp, k_slc, v_slc, k_win, v_win)]
    dkc, dvc, dks, dvs, dkw, dvw = zeros
    if "win" in res:
        o_w, win_vjp = res["win"]
        dgates[2] = _gate_sum(o_w, dout32)
        dq, dkw, dvw = win_vjp(g[..., 2:3] * dout32)
        dq = pad_dim(dq, Dkp)            # in q's dtype; the next kernel adds it in float32
    if "cmp_grouped" in res:
        o_c, cmp_vjp = res["cmp_grouped"]
        dgates[0] = _gate_sum(o_c, dout32)
        dq_c, dkc, dvc = cmp_vjp(g[..., 0:1] * dout32)
        dq = _add(dq, dq_c, Dkp)
    if "cmp" in res:
        o_c, lse_c = res["cmp"]
        dgates[0] = _gate_sum(o_c[..., :Dv], dout32)
        dq, dkc, dvc = cmp_backward(qp, pad_dim(k_cmp, Dkp), pad_dim(v_cmp, Dvp), o_c, lse_c,
                                    dop, g[..., 0], None, cfg, bs, scale, interpret,
                                    choices=st.choices, seg=seg, dq_in=dq,
                                    dq_dtype=jnp.float32 if "slc" in res else q.dtype)
    if "slc" in res:
        idx, o_s, lse_s, index = res["slc"]
        dgates[1] = _gate_sum(o_s[..., :Dv], dout32)
        sel_bwd = selection_kernels(st.choices, q.shape[1], q.shape[2] // k_slc.shape[2],
                                    q.dtype)[1]
        ksp, vsp = pad_dim(k_slc, Dkp), pad_dim(v_slc, Dvp)
        kw = {}
        if index and sel_bwd is sel_backward_block:
            kw = {"index": index[0]}           # the forward's indices, one per slot pass
        elif index and len(index[0]) == 1 and not atomic_mode(st.choices):
            kw = {"index": index[0][0]}        # query dQ + inverted dK/dV: one pass's index
        elif sel_bwd is sel_tiled_backward:
            mosaic = {key: tiled_backend(f"sel_tiled_{key}", st.choices, qp, ksp, vsp, cfg, seg,
                                         interpret) == "mosaic" for key in ("dq", "dkv")}
            kw = {"dq_kernel": mosaic_tiled_dq.sel_tiled_bwd_dq_mosaic if mosaic["dq"] else None,
                  "dkv_kernel": (mosaic_tiled_dkv.sel_tiled_bwd_dkv_mosaic if mosaic["dkv"]
                                 else None)}
            if not mosaic["dq"]:               # the chain's last kernel: q's dtype out
                kw.update(dq_in=dq, dq_dtype=q.dtype)
        dq_s, dks, dvs = sel_bwd(qp, ksp, vsp, idx, o_s, lse_s, dop, g[..., 1], cfg, bs, scale,
                                 interpret, choices=st.choices, seg=seg, **kw)
        dq = dq_s if "dq_in" in kw else _add(dq, dq_s, Dkp)
    dq = jnp.zeros(qp.shape, q.dtype) if dq is None else dq
    dg = jnp.stack(dgates, axis=-1).astype(gates.dtype)
    return (dq[..., :Dk].astype(q.dtype), dkc[..., :Dk], dvc[..., :Dv], dks[..., :Dk],
            dvs[..., :Dv], dkw.astype(k_win.dtype), dvw.astype(v_win.dtype), dg, None, None)


_nsa.defvjp(_nsa_fwd, _nsa_bwd)
