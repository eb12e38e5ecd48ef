"""Shared plumbing for the NSA Pallas kernels: backend choice, tile sizes, Triton API guards,
and the tile math every attention kernel repeats (online softmax, P from the saved lse, dS).

All kernels address their operands as whole-array refs and compute every index themselves
(``ref[b, t, head, :]`` style), which lowers to the same pointer arithmetic under Pallas-Triton
on the GPU and to gathers/dynamic slices in interpret mode on the CPU. Rules every kernel keeps:

* loads are masked with ``other=0`` (interpret mode pads out-of-bounds slices with NaN);
* stores through integer-array indices send masked rows to an out-of-bounds index, so interpret
  mode drops them (a scatter with a clamped duplicate index could overwrite a valid row);
* tile shapes are powers of two and every ``dot`` operand dimension is at least 16.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as plgpu

from nsa_jax.nsa.options import SEL_FWD_BLOCK_MAX_H, KernelChoices

# jax 0.4.3x named it TritonCompilerParams; 0.5+ (incl. 0.10.x / 0.11.x) CompilerParams.
_CompilerParams = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
MIN_DOT = 16  # smallest dot operand dimension Triton's tensor-core lowering accepts
NEG_INF = float("-inf")  # masked logit; running max of a row that has seen no key
POS_INF = float("inf")   # log-sum-exp of a row with no visible key (recomputed p = 0)


def use_interpret() -> bool:
    """Run kernels through the Pallas interpreter unless the default backend is a GPU."""
    return jax.default_backend() != "gpu"


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad_dim(x, D: int):
    """Zero-pad the last (head) dim to D (kernels use power-of-two head dims >= 16)."""
    if x.shape[-1] == D:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, D - x.shape[-1])])


def padded_dims(Dk: int, Dv: int) -> tuple[int, int]:
    """The kernels' head dims for Dk, Dv: powers of two >= MIN_DOT."""
    return max(MIN_DOT, next_pow2(Dk)), max(MIN_DOT, next_pow2(Dv))


def cudnn_applies(q, v, interpret: bool) -> bool:
    """cuDNN's fused attention can run these operands: compiled (not interpret) bf16/fp16 with
    equal head dims <= 128, multiples of 8 (the window branch and ``cmp_attn`` use it)."""
    return (not interpret) and jnp.dtype(q.dtype) in (jnp.dtype(jnp.bfloat16),
                                                      jnp.dtype(jnp.float16)) \
        and q.shape[-1] <= 128 and q.shape[-1] % 8 == 0 and v.shape[-1] == q.shape[-1]


def require_cudnn(key: str, q, v, interpret: bool, instead: str) -> None:
    """An explicit "cudnn" choice (``kernel.<key>``) where :func:`cudnn_applies` says no: one
    ValueError naming the key, what it got and the choices ``instead``."""
    if not cudnn_applies(q, v, interpret):
        raise ValueError(
            f"kernel.{key}: 'cudnn' needs bf16/fp16 operands on a GPU with equal head dims "
            f"<= 128 (multiples of 8); got {jnp.dtype(q.dtype).name}, head dims {q.shape[-1]}/"
            f"{v.shape[-1]}, {'interpret mode' if interpret else 'GPU'}; use {instead}")


def compiler_params(num_warps: int, num_stages: int):
    return _CompilerParams(num_warps=num_warps, num_stages=num_stages)


def dot(a, b, *, trans_a: bool = False, trans_b: bool = False, precision=None):
    """2-D matmul with float32 accumulation (``plgpu.dot``)."""
    return plgpu.dot(a, b, trans_a=trans_a, trans_b=trans_b, precision=precision)


def dot_precision(dtype, interpret: bool, choices: KernelChoices | None = None):
    """Precision of a kernel's dots by operand dtype and ``choices.f32_dot``: float32 operands
    on the GPU get IEEE dots ("ieee": HIGHEST -> Triton input_precision=ieee) or tf32
    ("tf32": DEFAULT -> Triton tf32); bf16/f16 use the tensor cores' native precision (None
    would follow ``jax_default_matmul_precision`` for float32, which is why it is never returned
    for float32 on the GPU); the CPU interpreter is exact either way."""
    if interpret or jnp.dtype(dtype) != jnp.float32:
        return None
    if choices_or_default(choices).f32_dot == "tf32":
        return lax.Precision.DEFAULT
    return lax.Precision.HIGHEST


def load(ref_view, mask, other=0):
    """Masked load; ``mask`` is broadcast to the loaded shape."""
    return plgpu.load(ref_view, mask=jnp.broadcast_to(mask, ref_view.shape), other=other)


def stored_dtype(dtype):
    """Dtype in which a float32 intermediate is kept between kernels (the block-major kernels'
    per-slot partials, the branch outputs saved for the backward): the input dtype when it is
    16-bit (half the bytes; one more rounding, as flash attention keeps O in the input dtype for
    its backward's rowsum(O * dO)), else float32."""
    return dtype if jnp.dtype(dtype).itemsize == 2 else jnp.float32


def store(ref_view, val, mask):
    plgpu.store(ref_view, val.astype(ref_view.dtype), mask=jnp.broadcast_to(mask, val.shape))


def idiv(a, b: int):
    """Integer division of non-negative int32 values by a static positive int."""
    return lax.div(a, jnp.int32(b))


# ---- tile math shared by the attention kernels ------------------------------------------------
# Logits are kept in base 2 (s * scale * log2(e)) so softmaxes use exp2 / log2.
def softmax_init(rows: int, dv: int):
    """Online-softmax state (running max m, running sum l, accumulator acc [rows, dv])."""
    return (jnp.full((rows,), NEG_INF, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, dv), jnp.float32))


def softmax_step(m, lsum, s, c, row_bias=None):
    """One online-softmax update (FlashAttention-2) over the raw dot ``s`` = Q K^T [R, K] (masked
    entries -inf) with ``c`` = scale * log2(e), base-2 logits s * c (+ ``row_bias`` [R], 0 or -inf
    per row): -> (m_new, alpha, p, lsum_new). The caller rescales its accumulator by alpha and
    adds p V. A row that has seen no key keeps m = -inf and gets p = 0 (no NaN); a row whose
    bias is -inf gets p = 0 (s * c - inf). A kernel whose s is already scaled passes c = 1.

    p = exp2(s * c - (m - bias)) is one fused multiply-add per entry, with the row maximum taken
    over the raw s (c > 0, so max(s * c) = c * max(s) exactly). Against scaling (and biasing) s
    first, one or two instructions fewer per entry: the tiled selection forward, issue-bound,
    went -6% on an H100 at 2k; kernels held by latency or bandwidth did not move (bench/NOTES.md,
    twenty-fourth session). p agrees with the two-step form to float32 rounding."""
    mx = jnp.max(s, axis=1) * c
    if row_bias is not None:
        mx = mx + row_bias
    m_new = jnp.maximum(m, mx)
    m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
    alpha = jnp.exp2(m - m_safe)
    sub = m_safe if row_bias is None else m_safe - row_bias   # +inf on a -inf-bias row
    p = jnp.exp2(s * c - sub[:, None])
    return m_new, alpha, p, lsum * alpha + jnp.sum(p, axis=1)


def softmax_first(s, c):
    """:func:`softmax_step` from the empty state (m = -inf, l = 0, acc = 0): -> (m, p, lsum), the
    caller's accumulator being p V. The same values without the empty state's rescale, which a
    kernel restarting its softmax on every tile (the block-major selection forward) would pay
    as a multiply-add per accumulator entry: the compiler keeps 0 * alpha, it cannot know that
    alpha is finite."""
    m = jnp.max(s, axis=1) * c
    m_safe = jnp.where(m == NEG_INF, 0.0, m)
    p = jnp.exp2(s * c - m_safe[:, None])
    return m, p, jnp.sum(p, axis=1)


def softmax_finish(m, lsum):
    """-> (divisor for acc (1 where no key was seen), base-2 lse (+inf where none was))."""
    has = lsum > 0
    l_safe = jnp.where(has, lsum, 1.0)
    return l_safe, jnp.where(has, m + jnp.log2(l_safe), POS_INF)


def softmax_scale_lse(m, lsum, approx: bool):
    """:func:`softmax_finish` as (1 / divisor, base-2 lse) for a kernel that normalises every
    tile (the block-major selection forward): with ``approx`` (compiled for a GPU, not the CPU
    interpreter) the reciprocal and log2 come from the GPU's approximate units (PTX
    ``rcp.approx.ftz.f32``, ``lg2.approx.f32``: about 1 ulp, and 2^-22 absolute for lsum in
    [1, 2^24)), one instruction each where the IEEE forms expand to ~15 and ~25 (sm_90 proxy,
    bench/kernel_sass.py). A row with keys has lsum >= 1 (its largest entry is 2^0)."""
    has = lsum > 0
    l_safe = jnp.where(has, lsum, 1.0)
    if approx:
        shape = [jax.ShapeDtypeStruct(l_safe.shape, jnp.float32)]
        inv, lg = (plgpu.elementwise_inline_asm(asm, args=[l_safe], constraints="=r,r", pack=1,
                                                result_shape_dtypes=shape)[0]
                   for asm in ("rcp.approx.ftz.f32 $0, $1;", "lg2.approx.f32 $0, $1;"))
    else:
        inv, lg = 1.0 / l_safe, jnp.log2(l_safe)
    return inv, jnp.where(has, m + lg, POS_INF)


def probs(s, mask, lse, c, row_bias=None):
    """P = exp2(s * c - lse) recomputed from the saved base-2 lse (backward passes) for the raw
    dot ``s`` = Q K^T and ``c`` = scale * log2(e): one fused multiply-add per entry
    (:func:`softmax_step`), masked after it; 0 where ``mask`` (broadcast to s; None: no mask) is
    False, where s is -inf, where lse is +inf, or where ``row_bias`` [R] (0 or -inf per row;
    taken as lse - bias) is -inf."""
    sub = lse if row_bias is None else lse - row_bias
    x = s * c - sub[:, None]   # masked after the multiply-add, so that it stays one instruction
    return jnp.exp2(x if mask is None else jnp.where(mask, x, NEG_INF))


def dscores(p, do, v, gs, delta, prec):
    """dS = P * (dP - delta) with dP = (dO V^T) * gs: the softmax backward of one tile.
    ``gs`` [R] is the per-row output scale (branch gate) applied in float32 after the dot and
    ``delta`` [R] = gs * rowsum(O * dO); ``gs`` None: the gate is already folded into P and
    delta (``fold_gate``), dP = dO V^T."""
    dp = dot(do, v, trans_b=True, precision=prec)
    dp = dp if gs is None else dp * gs[:, None]
    return p * (dp - delta[:, None])


def fold_gate(lse, gs, o, do):
    """A branch's gate folded into its saved base-2 lse, for the backward kernels that take no
    ``gs`` (the selection branch's gather kernels): -> (lse - log2 gs, rowsum(O * dO)), both
    float32 [B,T,Hq]. With P' = exp2(s c - lse + log2 gs) = gs P, the gated backward (Eq. 5's
    g * o differentiated) is dV += P'^T dO and dS = P' (dO V^T - rowsum(O dO)): the same values
    as ``dscores`` / ``dkv_accumulate`` with ``gs``, without a multiply by gs per logit and a
    gs load per row. Gates are sigmoid values (Eq. 5), so gs >= 0: gs = 0 gives lse' = +inf,
    P' = 0, as the gated form's 0 * P; a negative gs has no log (NaN gradients, never silently
    wrong ones). ``gs`` None: lse unchanged (scale 1)."""
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    if gs is None:
        return lse, delta
    return lse - jnp.log2(gs.astype(jnp.float32)), delta


def dkv_accumulate(dk, dv, s, mask, q, do, v, gs, lse, delta, prec, cdt, c):
    """One query tile's share of a key tile's dK and dV (the FlashAttention-2 backward of a
    branch, Eq. 5 differentiated), from its raw logits ``s`` = Q K^T: P recomputed from the saved
    base-2 lse (:func:`probs` with ``c`` = scale * log2(e); ``mask`` None: no mask), dV +=
    (P * gs)^T dO, dS = P * (dP - delta) (``dscores``), dK += dS^T Q, unscaled (the caller
    applies the softmax scale once, at the store); ``gs`` None: folded into lse and delta
    (``fold_gate``). -> (dk, dv, dS in the compute dtype ``cdt``, for a kernel that also forms
    dQ)."""
    p = probs(s, mask, lse, c)
    pg = p if gs is None else p * gs[:, None]
    dv = dv + dot(pg.astype(cdt), do, trans_a=True, precision=prec)
    ds = dscores(p, do, v, gs, delta, prec).astype(cdt)
    dk = dk + dot(ds, q, trans_a=True, precision=prec)
    return dk, dv, ds


def dkv_accumulate_t(dk, dv, st, mask_t, q, do, v, gs, lse, delta, prec, cdt, c,
                     row_bias=None):
    """:func:`dkv_accumulate` with keys as rows: ``st`` = K Q^T, raw [keys, rows] (``mask_t`` the
    same shape, or None; ``row_bias`` [rows], 0 or -inf per query row, taken as lse - bias), so
    P^T and dS^T come out of their dots already as the left operands of dV += P^T dO and dK +=
    dS^T Q (in registers, no transpose through shared memory and the barrier around it) and
    dP^T = V dO^T. The same values up to the dots' summation order. -> (dk, dv).

    Measured on an H100 (bench/NOTES.md, twenty-third session): it pays where a kernel's q / dO
    are contiguous tiles and no dQ dot follows (tiled selection dK/dV -7%, document-local dK/dV
    -19%); where dQ += dS K follows (block-major backward, +19%) or the rows are gathered (the
    compressed backward, +44%) the transpose comes back and those kernels keep
    :func:`dkv_accumulate`."""
    # P^T as in probs, its subtrahend formed broadcast: formed as a vector first, the sm_90 proxy
    # (bench/kernel_sass.py) compiled this loop with 5x the shared-memory loads
    sub = lse[None, :] if row_bias is None else lse[None, :] - row_bias[None, :]
    x = st * c - sub
    pt = jnp.exp2(x if mask_t is None else jnp.where(mask_t, x, NEG_INF))
    ptg = pt if gs is None else pt * gs[None, :]   # gs None: folded into lse (fold_gate)
    dv = dv + dot(ptg.astype(cdt), do, precision=prec)
    dpt = dot(v, do, trans_b=True, precision=prec)
    dpt = dpt if gs is None else dpt * gs[None, :]
    dk = dk + dot((pt * (dpt - delta[None, :])).astype(cdt), q, precision=prec)
    return dk, dv


def grad_rows(q_ref, do_ref, gs_ref, lse_ref, delta_ref, b, rows, hd, ok, cdt):
    """A backward tile's per-row operands for the query rows ``rows`` (a ``pl.ds``) of head hd:
    q, dO (cast to the compute dtype ``cdt``), the output scale gs (None where ``gs_ref`` is:
    folded into lse, ``fold_gate``), the saved base-2 lse (+inf on masked rows, so their
    recomputed p is 0) and delta; rows where ``ok`` is False load 0."""
    q = load(q_ref.at[b, rows, hd, :], ok[:, None])
    do = load(do_ref.at[b, rows, hd, :], ok[:, None]).astype(cdt)
    gs = None if gs_ref is None else load(gs_ref.at[b, rows, hd], ok)
    lse = load(lse_ref.at[b, rows, hd], ok, POS_INF)
    delta = load(delta_ref.at[b, rows, hd], ok)
    return q, do, gs, lse, delta


def rope_halves(x1, x2, cos, sin):
    """RoPE's rotate-half inside a kernel (:func:`nsa_jax.nsa.rope.apply_rope`) on the two
    halves of a head, in float32: -> (x1 cos - x2 sin, x2 cos + x1 sin). The decode step's
    cache-write and φ-emission kernels rotate with it."""
    x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


def sel_sub_tiles(l_sel: int, sel_keys: int):
    """Key sub-tile size BK and count for one selected block of l' keys (selection kernels)."""
    bk = min(sel_keys, max(MIN_DOT, next_pow2(l_sel)))
    return bk, cdiv(l_sel, bk)


_SCORE_PRECISIONS = {"tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
                     "ieee": lax.Precision.HIGHEST}  # by KernelChoices.score_dot


def score_precision(name: str, interpret: bool):
    return None if interpret else _SCORE_PRECISIONS[name]


def choices_or_default(choices: KernelChoices | None) -> KernelChoices:
    if choices is None:
        return KernelChoices()
    if not isinstance(choices, KernelChoices):
        raise TypeError(f"choices must be a KernelChoices, got {type(choices).__name__}")
    return choices


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes and launch parameters of the NSA kernels (all tiles powers of two). Which
    algorithm runs is a separate choice: ``nsa_jax.nsa.options.KernelChoices``.

    Rows of the compressed-attention and inverted selection-backward tiles are (query, head)
    pairs of one KV group: a tile holds ``rows // h`` queries times the group's h heads, so every
    head of a group shares one K/V load and small groups still fill a tensor-core tile.

    cmp_rows:     (query, head) rows per compressed-attention tile (fwd, scoring, dq, dk/dv).
    cmp_keys:     compressed keys per tile in the compressed-attention forward.
    score_sel:    selection blocks per scoring tile (S); the scoring kernel walks compressed
                  keys in steps of S * l'/d so each step finishes S block scores.
    score_q:      queries per scoring tile in the "loop" layout (``KernelChoices.score_heads``):
                  rows of one head, the group's h heads looped per key step.
    score_splits: key-range splits of the scoring kernel (each range of score columns its own
                  program); None: ``scoring.score_splits``, which splits only grids of fewer
                  than 512 programs (a chunked prefill's continuation chunks, not training).
    sel_keys:     keys per sub-tile of a selected block (l' is split or masked to this) in the
                  block-major, tiled and inverted dK/dV selection kernels.
    sel_q_keys:   keys per step of the query-major selection kernels (forward, dQ): their loop
                  walks (block, sub-tile) steps, so a smaller step with more ``sel_stages``
                  keeps more, smaller tile loads in flight per program (at the bench shape,
                  64k, only 32-key steps at one warp and 3 stages were faster, by 3-4%: the
                  forward is L2-bound there; ``for_shape`` takes them for bf16 128-wide heads;
                  bench/NOTES.md, fourteenth and fifteenth sessions).
    sel_rows:     (query, head) rows per tile in the inverted selection dK/dV kernel and the
                  block-major selection forward (and, through them, the queries per work item
                  of their index: ``sel_chunk`` rounded up to whole tiles).
    sel_bwd_warps: warps of the inverted selection dK/dV kernel (``nsa_sel_bwd_dkv``; None:
                  ``num_warps``). With bf16 128-wide heads its tiles are 64 rows at 4 warps: on
                  an H100 at the bench shape, 64k, 128 rows at 8 warps held one program per SM
                  (215 registers per thread, 182 KB of shared memory; Nsight Compute) and the
                  selection backward took 37.0 ms against 33.7 (bench/NOTES.md, fifteenth
                  session).
    sel_chunk:    queries per dK/dV work item (a slice of one block's query list).
    sel_dq_rows:  (query, head) rows per tile in the block-major backward that forms dQ with
                  dK/dV (``KernelChoices.sel_dq = "block"``; it holds a dQ tile more than the
                  dK/dV kernel: on an H200 at the 125M shape, 64k, 64 rows took 5.1 ms and
                  128 rows 6.4 ms; bench/NOTES.md).
    sel_tile_q:   queries per tile of the tiled selection kernels (rows of one head).
    win_q, win_keys: queries (rows of one head) and keys per tile of the document-local
                  attention kernels (``local.py``: packed window branch, packed dense).
    cmp_bwd_keys: compressed keys per tile in the compressed-attention backward (dQ and dK/dV).
    cmp_bwd_rows, cmp_bwd_warps: the compressed backward's (query, head) rows per tile and
                  warps (None: ``cmp_rows`` and ``num_warps``, as the forward). With bf16 128-wide
                  heads 64 rows at 4 warps: on an H100 at the bench shape, 64k, the Pallas
                  compressed backward took 41.4 ms against 46.7 at 128 rows and 8 warps, while
                  the forward and scoring were slower at 64 rows (bench/NOTES.md, fifteenth
                  session).
    cmp_warps:    warps of the compressed forward (None: ``num_warps``). Its tiles are
                  ``cmp_rows`` = 128 (query, head) rows: with bf16 128-wide heads 8 warps (two
                  warpgroups of 64 rows) where every 64-row kernel takes 4 (``for_shape``).
    num_warps, num_stages: Triton launch parameters for the tile kernels; sel_warps and
                  sel_stages for the per-query selection kernels (16-row tiles); score_warps
                  for the scoring kernel.
    topn_elems, topn_warps: score elements (rows x row width) and warps per top-n program (one
                  warp per 1024-wide row: 1.67 ms against 2.05 for 4 rows over 4 warps at
                  the 125M shape, 64k, on an H200; bench/NOTES.md).
    topn_tour_rows: rows per program of the tournament top-n (``topn._tour_kernel``, buckets of
                  512-2048 columns); None: ``topn_elems`` // width, as the rounds kernel (2 rows
                  at 512 columns). One row: the top-n at the 125M shape, 64k, 0.561 -> 0.528 ms
                  on an H100 (bench/NOTES.md, twenty-sixth session).
    """
    cmp_rows: int = 128
    cmp_keys: int = 128
    score_sel: int = 16
    score_q: int = 64
    score_splits: int | None = None
    sel_keys: int = 64
    sel_q_keys: int = 64
    sel_rows: int = 128
    sel_chunk: int = 1024
    sel_dq_rows: int = 64
    sel_tile_q: int = 64
    cmp_bwd_keys: int = 64
    cmp_bwd_rows: int | None = None
    cmp_bwd_warps: int | None = None
    win_q: int = 64
    win_keys: int = 64
    cmp_warps: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    sel_warps: int = 2
    sel_bwd_warps: int | None = None
    score_warps: int = 4
    sel_stages: int = 2
    topn_elems: int = 1024
    topn_warps: int = 1
    topn_tour_rows: int | None = 1

    def __post_init__(self):
        unset_ok = ("cmp_bwd_rows", "sel_bwd_warps", "cmp_bwd_warps",
                    "cmp_warps")                                         # None: the shared field
        for f in ("cmp_rows", "cmp_keys", "score_sel", "score_q", "sel_keys", "sel_q_keys",
                  "sel_rows", "cmp_bwd_keys", "cmp_bwd_rows", "sel_tile_q", "win_q", "win_keys",
                  "sel_dq_rows", "topn_elems"):
            v = getattr(self, f)
            if v is None and f in unset_ok:
                continue
            if v < MIN_DOT or v & (v - 1):
                raise ValueError(f"BlockSizes.{f}: must be a power of two >= {MIN_DOT}, got {v}")
        v = self.topn_tour_rows
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1
                              or v & (v - 1) or v > 64):
            raise ValueError("BlockSizes.topn_tour_rows: None or a power of two in 1..64, "
                             f"got {v!r}")
        v = self.score_splits
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"BlockSizes.score_splits: None or a positive int, got {v!r}")
        if self.sel_chunk < 1:
            raise ValueError(f"BlockSizes.sel_chunk: must be positive, got {self.sel_chunk}")
        for f in ("num_warps", "sel_warps", "score_warps", "topn_warps", "sel_bwd_warps",
                  "cmp_bwd_warps", "cmp_warps"):
            v = getattr(self, f)
            if not (v is None and f in unset_ok) and v not in (1, 2, 4, 8, 16):
                raise ValueError(f"BlockSizes.{f}: 1, 2, 4, 8 or 16, got {v}")
        for f in ("num_stages", "sel_stages"):
            if getattr(self, f) < 1:
                raise ValueError(f"BlockSizes.{f}: must be >= 1, got {getattr(self, f)}")

    @classmethod
    def for_shape(cls, h: int, head_dim: int, itemsize: int = 2) -> "BlockSizes":
        """Defaults by group size h, head dim and operand bytes: 128 rows (query, head) per tile.
        Warps: at most 4 per 64 tile rows, since a wgmma is one warpgroup (4 warps) over 64 rows
        and 8 warps on a 64-row tile split its columns between two warpgroups. With bf16 128-wide
        heads every kernel takes 4 warps but the compressed forward, whose 128-row tiles take 8
        (``cmp_warps``). Its 64-row kernels ran at 8 warps until the thirtieth session (on an
        H100 the packed window at 64k then took 41.6 ms against 25.5, the op at 4k / B=4 31.3 ms
        against 19.5, the block-major pair 20% more; bench/NOTES.md). There the inverted dK/dV
        kernel and the compressed backward take 64-row tiles (``sel_rows``, ``cmp_bwd_rows``),
        and the per-query kernels one
        warp walking 32-key steps in 3 stages (bench shape, 64k, on an H200: selection forward
        15.9 -> 15.4 ms and backward 35.0 -> 32.4; bench/NOTES.md, fifteenth session). float32
        operands with 128-wide heads get half the rows and keys and one pipeline stage (the
        bf16 tiles need 256 KB of shared memory in float32, more than an H100/H200 SM has: seen
        on an H200, "requested 262144, available 232448"). bf16 heads narrower than 128 in
        groups the block-major forward serves (h <= 8) take 64-row ``sel_rows`` tiles: at the 125M
        shape (h = 6, 64-wide heads) on an H100 the block forward went 0.98 -> 0.88 ms at 8k and
        2.16 -> 1.91 ms at 64k (207 registers per thread at 128 rows held 2 CTAs per SM;
        bench/NOTES.md, twenty-third session). The same field sets the inverted dK/dV kernel's
        tiles (``sel_dq: query`` there; 64 rows measured even with 128 at 8k on an H200, second
        session) and the index's work-item chunk. Those groups also take work items of 512
        queries (``sel_chunk``): on an H200 at the 125M shape the NSA op (fwd+bwd) went 4.54 ->
        4.46 ms at 8k / B=4 and 13.16 -> 12.95 at 64k against 1024 (shorter items leave less of
        a last wave idle; 256 had the faster forward and the slower backward, 2048 was 9%
        slower; bench/NOTES.md, thirty-seventh session)."""
        if itemsize >= 4 and head_dim >= 128:   # never measured against the rule above
            return cls(num_warps=8, cmp_rows=64, cmp_keys=64, sel_rows=64, sel_tile_q=32,
                       cmp_bwd_keys=32, win_q=32, win_keys=32, sel_dq_rows=32, num_stages=1)
        if head_dim >= 128:
            return cls(cmp_warps=8, sel_rows=64, sel_warps=1, sel_q_keys=32, sel_stages=3,
                       cmp_bwd_rows=64)
        if itemsize == 2 and h <= SEL_FWD_BLOCK_MAX_H:
            return cls(sel_rows=64, sel_chunk=512)
        return cls()
