"""The decode step's dense (non-attention) parts of a block as Pallas kernels, for a few rows.

A decode step multiplies a handful of rows (one token per batch row) by each weight matrix. XLA
runs each RMSNorm as two kernels (the sum of squares, then the scaled convert), each residual add
and the SwiGLU product as one more, around its GEMMs: eight small kernels per layer besides the
matmuls, each a few microseconds of launch and ramp for a few kilobytes (bench/NOTES.md,
nineteenth session). Here the norm is the prologue and the SwiGLU gate or the residual add the
epilogue of the matmul itself:

* :func:`norm_matmul`: ``RMSNorm(x) @ W`` (the projections after ``norm1``; with ``glu``,
  ``silu(a) * b`` of ``RMSNorm(x) @ [Wa | Wb]``, the MLP's input half after ``norm2``);
* :func:`matmul_add`: ``res + a @ W`` (the attention's output projection and the MLP's output,
  each added to the residual stream).

Every program computes a ``bm`` x ``bn`` tile of the output over the whole K axis (the few
rows' norm is recomputed by each program: K values per row), so the grid is the output's
column tiles: 16-column tiles give 48-128 programs for the 125M model's matrices, each streaming
its own slice of the weight. The rounding follows the modules they replace
(``flax.nnx.RMSNorm`` and ``nnx.Linear`` in the compute dtype, then the bf16 add and SwiGLU):
the statistics and the scale in float32, one rounding to the compute dtype before each matmul,
the matmul's float32 sum rounded to the compute dtype, and the SwiGLU and residual add rounded
after each operation. ``*_reference`` are the jax.numpy twins with the same rounding.

Inference only: no VJP (a decode step is never differentiated).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import (MIN_DOT, cdiv, compiler_params, dot, dot_precision, load,
                                   next_pow2, store, use_interpret)

BN = 16     # output columns per program
BK = 256    # reduction (K) elements per step of a program's loop
BM = 64     # rows per program at most (a decode step has one per batch row)


def _tiles(M: int, K: int, N: int, bn: int | None, bk: int | None):
    bm = min(BM, max(MIN_DOT, next_pow2(M)))
    return bm, bn or BN, min(bk or BK, max(MIN_DOT, next_pow2(K)))


def _rows(i, bm, M):
    return i * bm + jnp.arange(bm) < M


def _x_chunk(x_ref, i, rok, c: int, bm, bk, K):
    """Rows i*bm.. and columns c*bk.. of x as float32 (``pl.ds`` slices: contiguous, so the
    loads vectorise; indices built from clamped index arrays made Triton load element by element)."""
    kok = c * bk + jnp.arange(bk) < K
    k0 = _start(c * bk, i)
    x = load(x_ref.at[pl.ds(i * bm, bm), pl.ds(k0, bk)], rok[:, None] & kok[None, :], 0.0)
    return x.astype(jnp.float32), k0, kok


def _start(k0: int, i):
    """A static slice start as a traced value (+ 0 * a program id): the last K step may reach
    past K, which a static ``pl.ds`` refuses at trace time; the load's mask covers it."""
    return k0 + 0 * i


def _w_tile(w_ref, k0, kok, c0, nok, bn):
    return load(w_ref.at[pl.ds(k0, kok.shape[0]), pl.ds(c0, bn)], kok[:, None] & nok[None, :], 0.0)


def _round(x, dtype):
    return x.astype(dtype).astype(jnp.float32)


def _silu_gate(a, b, dtype):
    """silu(a) * b as jax.nn.silu then the product evaluate it in ``dtype``: a * sigmoid(a),
    each operation rounded to ``dtype`` (float32: no rounding)."""
    sig = _round(1.0 / (1.0 + jnp.exp(-a)), dtype)
    return _round(_round(a * sig, dtype) * b, dtype)


# ---- RMSNorm prologue -----------------------------------------------------------------------
def _norm_matmul_kernel(x_ref, s_ref, w_ref, o_ref, *, K, N, bm, bn, bk, eps, glu, prec):
    i, j = pl.program_id(0), pl.program_id(1)
    M = x_ref.shape[0]
    dt = w_ref.dtype
    rok = _rows(i, bm, M)
    nk = cdiv(K, bk)

    cols = j * bn + jnp.arange(bn)
    nok = cols < N
    # Every load is issued up front (the K loop unrolled, no loop-carried address): the
    # program's time is then one round trip to memory, not one per K step (a fori_loop took
    # 2-4x XLA's GEMM time; bench/NOTES.md, nineteenth session).
    xs = [_x_chunk(x_ref, i, rok, c, bm, bk, K) for c in range(nk)]
    ss = [load(s_ref.at[pl.ds(k0, bk)], kok, 0.0).astype(jnp.float32) for _, k0, kok in xs]
    wa = [_w_tile(w_ref, k0, kok, j * bn, nok, bn) for _, k0, kok in xs]
    wb = [_w_tile(w_ref, k0, kok, N + j * bn, nok, bn) for _, k0, kok in xs] if glu else []
    # flax.nnx.RMSNorm: var = mean(x^2) in float32, y = x * (rsqrt(var + eps) * scale)
    inv = lax.rsqrt(sum(jnp.sum(x * x, axis=1) for x, _, _ in xs) / K + eps)
    acc_a = jnp.zeros((bm, bn), jnp.float32)
    acc_b = jnp.zeros((bm, bn), jnp.float32)
    for c, (x, _, _) in enumerate(xs):
        xn = (x * (inv[:, None] * ss[c][None, :])).astype(dt)
        acc_a += dot(xn, wa[c], precision=prec)
        if glu:
            acc_b += dot(xn, wb[c], precision=prec)
    out = _silu_gate(_round(acc_a, dt), _round(acc_b, dt), dt) if glu else acc_a
    ri = i * bm + jnp.arange(bm)
    store(o_ref.at[jnp.where(rok, ri, M)[:, None], jnp.where(nok, cols, N)[None, :]], out,
          rok[:, None] & nok[None, :])


def norm_matmul(x, scale, w, *, eps: float, glu: bool = False, bn: int | None = None,
                bk: int | None = None, stages: int = 3, warps: int = 4):
    """RMSNorm(x) @ w for a few rows: x [M, K] (the residual stream), scale [K] (the norm's
    weight), w [K, N] -> [M, N] in w's dtype (the compute dtype). ``glu``: w holds [Wa | Wb]
    (N = 2H) and the result is silu(RMSNorm(x) @ Wa) * (RMSNorm(x) @ Wb) [M, H] (SwiGLU)."""
    M, K = x.shape
    if scale.shape != (K,) or w.shape[0] != K:
        raise ValueError(f"norm_matmul: x [M, K={K}], scale [K], w [K, N]; got scale "
                         f"{scale.shape}, w {w.shape}")
    N = w.shape[1] // 2 if glu else w.shape[1]
    if glu and w.shape[1] != 2 * N:
        raise ValueError(f"norm_matmul(glu=True): w [K, 2H] holds [Wa | Wb], got {w.shape}")
    bm, bn, bk = _tiles(M, K, N, bn, bk)
    interpret = use_interpret()
    kern = functools.partial(_norm_matmul_kernel, K=K, N=N, bm=bm, bn=bn, bk=bk, eps=eps,
                             glu=glu, prec=dot_precision(w.dtype, interpret))
    return pl.pallas_call(
        kern, grid=(cdiv(M, bm), cdiv(N, bn)),
        out_shape=jax.ShapeDtypeStruct((M, N), w.dtype),
        compiler_params=compiler_params(warps, stages), interpret=interpret,
        name="nsa_decode_norm_glu" if glu else "nsa_decode_norm_matmul",
    )(x, scale.astype(x.dtype), w)


def norm_matmul_reference(x, scale, w, *, eps: float, glu: bool = False):
    """The jax.numpy twin of :func:`norm_matmul` (``nnx.RMSNorm`` then ``nnx.Linear`` in w's
    dtype, then ``swiglu``), the same roundings."""
    dt = w.dtype
    xf = x.astype(jnp.float32)
    inv = lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    xn = (xf * (inv * scale.astype(x.dtype).astype(jnp.float32))).astype(dt)
    u = jnp.dot(xn, w, preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST)
    if not glu:
        return u.astype(dt)
    a, b = jnp.split(_round(u, dt), 2, axis=-1)
    return _silu_gate(a, b, dt).astype(dt)


# ---- residual-add epilogue ------------------------------------------------------------------
def _matmul_add_kernel(a_ref, w_ref, r_ref, o_ref, *, K, N, bm, bn, bk, prec):
    i, j = pl.program_id(0), pl.program_id(1)
    M = a_ref.shape[0]
    rok = _rows(i, bm, M)
    cols = j * bn + jnp.arange(bn)
    nok = cols < N

    ok = rok[:, None] & nok[None, :]
    res = load(r_ref.at[pl.ds(i * bm, bm), pl.ds(j * bn, bn)], ok, 0.0).astype(jnp.float32)
    tiles = []                       # all loads up front, as in _norm_matmul_kernel
    for c in range(cdiv(K, bk)):
        kok = c * bk + jnp.arange(bk) < K
        k0 = _start(c * bk, i)
        tiles.append((load(a_ref.at[pl.ds(i * bm, bm), pl.ds(k0, bk)],
                           rok[:, None] & kok[None, :], 0.0),
                      _w_tile(w_ref, k0, kok, j * bn, nok, bn)))
    acc = jnp.zeros((bm, bn), jnp.float32)
    for a, w in tiles:
        acc += dot(a, w, precision=prec)
    out = res + _round(acc, w_ref.dtype)          # nnx.Linear's output, then the add
    ri = i * bm + jnp.arange(bm)
    store(o_ref.at[jnp.where(rok, ri, M)[:, None], jnp.where(nok, cols, N)[None, :]], out, ok)


def matmul_add(a, w, res, *, bn: int | None = None, bk: int | None = None, stages: int = 3,
               warps: int = 4):
    """res + a @ w for a few rows: a [M, K] and w [K, N] in the compute dtype, res [M, N] (the
    residual stream) -> [M, N] in res's dtype."""
    M, K = a.shape
    N = w.shape[1]
    if w.shape[0] != K or res.shape != (M, N):
        raise ValueError(f"matmul_add: a [M={M}, K={K}], w [K, N], res [M, N]; got w {w.shape}, "
                         f"res {res.shape}")
    bm, bn, bk = _tiles(M, K, N, bn, bk)
    interpret = use_interpret()
    kern = functools.partial(_matmul_add_kernel, K=K, N=N, bm=bm, bn=bn, bk=bk,
                             prec=dot_precision(w.dtype, interpret))
    return pl.pallas_call(
        kern, grid=(cdiv(M, bm), cdiv(N, bn)),
        out_shape=jax.ShapeDtypeStruct((M, N), res.dtype),
        compiler_params=compiler_params(warps, stages), interpret=interpret,
        name="nsa_decode_matmul_add",
    )(a.astype(w.dtype), w, res)


def matmul_add_reference(a, w, res):
    """The jax.numpy twin of :func:`matmul_add`: the matmul rounded to w's dtype, then the add in
    float32 rounded to res's dtype."""
    u = jnp.dot(a.astype(w.dtype), w, preferred_element_type=jnp.float32,
                precision=lax.Precision.HIGHEST)
    return (res.astype(jnp.float32) + _round(u, w.dtype)).astype(res.dtype)
