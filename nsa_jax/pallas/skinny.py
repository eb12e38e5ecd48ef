"""The decode step's dense layers as row-skinny matmuls: one Pallas kernel per matmul with its
RMSNorm, SwiGLU or residual add fused in (issue 14).

A decode step multiplies B rows (B = the batch, a few to a few dozen) by each weight matrix, so
its matmuls are weight reads: at B = 8 a 125M layer reads 13 MB of weights for 0.2 GFLOP. In
XLA each layer's dense part was eleven kernels (two RMSNorm reductions and their converts, four
matmuls, two residual adds, the SwiGLU product), a few microseconds each, mostly launch and
ramp, and the matmuls walked K in small pipelined tiles on a few dozen programs (bench/NOTES.md,
twenty-seventh session). Here each matmul is one kernel over ``cdiv(N, bn)`` column slabs (and
row tiles of up to 64 rows): a program reads its [K, bn] slab of the weight in ``bk``-row chunks
(software-pipelined: ``stages`` chunks in flight), and

* ``norm=(scale, eps)``: x -> RMSNorm(x) first, with flax ``nnx.RMSNorm``'s arithmetic:
  y = x * (rsqrt(mean(x^2) + eps) * scale) in float32, rounded to the compute dtype;
* ``glu=True``: the weight is [K, 2H] = [a | b] (``SwiGLU.w_in``) and the output is
  silu(a) * b [M, H], a and b rounded to the compute dtype first (the matmul's output dtype);
* ``residual`` [M, N]: the output is residual + x @ w, the product rounded first (the block's
  ``x + a``).

The reference twin is the XLA expression the model runs on every other path
(:func:`skinny_reference`); float32 interpret runs match it to float rounding, bf16 to one
rounding of each intermediate.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import (MIN_DOT, cdiv, compiler_params, dot, dot_precision, load,
                                   next_pow2, store)

BN = 16        # output columns per program (the tensor cores' smallest dot width)
BK = 256       # weight rows per pipelined chunk
BM = 64        # batch rows per program at most (larger batches get a second grid axis)
STAGES = 3     # chunks in flight (Triton num_stages)
WARPS = 4


def _kernel(*refs, M, K, Nout, H, bm, bn, bk, norm, eps, glu, residual, prec, nk_layout):
    x_ref, w_ref = refs[:2]
    k = 2
    s_ref = r_ref = None
    if norm:
        s_ref, k = refs[k], k + 1
    if residual:
        r_ref, k = refs[k], k + 1
    o_ref = refs[k]
    j, mi = pl.program_id(0), pl.program_id(1)
    rows = mi * bm + jnp.arange(bm)
    rok = rows < M
    rr = jnp.where(rok, rows, 0)
    cols = j * bn + jnp.arange(bn)
    cok = cols < Nout
    cc = jnp.where(cok, cols, 0)
    cdt = w_ref.dtype
    nk = cdiv(K, bk)

    def x_chunk(c):
        kk = c * bk + jnp.arange(bk)
        kok = kk < K
        return load(x_ref.at[rr[:, None], jnp.where(kok, kk, 0)[None, :]],
                    rok[:, None] & kok[None, :]), kk, kok

    if norm:   # mean(x^2) over the K columns, float32 (flax's _compute_stats)
        def sq(c, acc):
            xc, _, _ = x_chunk(c)
            xf = xc.astype(jnp.float32)
            return acc + jnp.sum(xf * xf, axis=1)

        var = lax.fori_loop(0, nk, sq, jnp.zeros((bm,), jnp.float32)) / K
        inv = lax.rsqrt(var + eps)

    def step(c, accs):
        xc, kk, kok = x_chunk(c)
        kc = jnp.where(kok, kk, 0)
        if norm:
            sc = load(s_ref.at[kc], kok).astype(jnp.float32)
            xc = (xc.astype(jnp.float32) * (inv[:, None] * sc[None, :])).astype(cdt)
        else:
            xc = xc.astype(cdt)
        def w_tile(c0):
            if nk_layout:   # w stored [N, K]: each output column's weights contiguous
                t = load(w_ref.at[(c0 + cc)[:, None], kc[None, :]], cok[:, None] & kok[None, :])
                return dot(xc, t, trans_b=True, precision=prec)
            t = load(w_ref.at[kc[:, None], (c0 + cc)[None, :]], kok[:, None] & cok[None, :])
            return dot(xc, t, precision=prec)

        out = [accs[0] + w_tile(0)]
        if glu:
            out.append(accs[1] + w_tile(H))
        return tuple(out)

    zero = jnp.zeros((bm, bn), jnp.float32)
    accs = lax.fori_loop(0, nk, step, (zero, zero) if glu else (zero,))
    y = accs[0].astype(cdt).astype(jnp.float32)          # the matmul's output dtype
    if glu:
        b = accs[1].astype(cdt).astype(jnp.float32)
        y = (y * jax.nn.sigmoid(y) * b).astype(cdt).astype(jnp.float32)   # silu(a) * b
    if residual:
        y = load(r_ref.at[rr[:, None], cc[None, :]], rok[:, None] & cok[None, :]).astype(
            jnp.float32) + y
    ro = jnp.where(rok, rows, M)                           # masked rows: out of bounds, dropped
    store(o_ref.at[ro[:, None], jnp.where(cok, cols, Nout)[None, :]], y,
          rok[:, None] & cok[None, :])


def _check(x, w, norm, residual, glu):
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"skinny_matmul: x [M, K] and w [K, N], got {x.shape} and {w.shape}")
    if glu and w.shape[1] % 2:
        raise ValueError(f"skinny_matmul(glu=True): w holds [a | b], an even width; got "
                         f"{w.shape[1]}")
    nout = w.shape[1] // 2 if glu else w.shape[1]
    if residual is not None and residual.shape != (x.shape[0], nout):
        raise ValueError(f"skinny_matmul: residual must be [M, N] = {(x.shape[0], nout)}, got "
                         f"{residual.shape}")
    if norm is not None and norm[0].shape != (x.shape[1],):
        raise ValueError(f"skinny_matmul: norm scale must be [K] = [{x.shape[1]}], got "
                         f"{norm[0].shape}")
    return nout


def skinny_matmul(x, w, *, norm=None, residual=None, glu: bool = False, interpret: bool,
                  bn: int = BN, bk: int = BK, stages: int = STAGES, warps: int = WARPS,
                  w_nk: bool = False):
    """x [M, K] @ w [K, N] in w's dtype (the compute dtype) for small M, with the optional
    RMSNorm prologue (``norm=(scale [K], eps)``), SwiGLU epilogue (``glu``: w = [a | b], output
    [M, N/2]) and residual add (``residual`` [M, N_out]); module docstring. ``bn`` output
    columns per program, ``bk`` weight rows per chunk (powers of two >= 16), ``stages`` chunks
    in flight, ``warps`` per program. ``w_nk``: w is given transposed, [N, K] (each output
    column's weights contiguous in memory)."""
    if w_nk:
        w = w.T   # shapes checked in the [K, N] view; the kernel reads the [N, K] array
    nout = _check(x, w, norm, residual, glu)
    for name, v in (("bn", bn), ("bk", bk)):
        if v < MIN_DOT or v & (v - 1):
            raise ValueError(f"skinny_matmul: {name} must be a power of two >= {MIN_DOT}, got {v}")
    M, K = x.shape
    bm = max(MIN_DOT, min(BM, next_pow2(M)))
    bk = min(bk, max(MIN_DOT, next_pow2(K)))
    cdt = w.dtype
    args = [x, w.T if w_nk else w]
    if norm is not None:
        args.append(norm[0].astype(cdt))     # flax promotes the scale to the compute dtype
    if residual is not None:
        args.append(residual)
    kern = functools.partial(_kernel, M=M, K=K, Nout=nout, H=w.shape[1] // 2 if glu else 0,
                             bm=bm, bn=bn, bk=bk, norm=norm is not None,
                             eps=float(norm[1]) if norm is not None else 0.0, glu=glu,
                             residual=residual is not None,
                             prec=dot_precision(cdt, interpret), nk_layout=w_nk)
    return pl.pallas_call(
        kern, grid=(cdiv(nout, bn), cdiv(M, bm)),
        out_shape=jax.ShapeDtypeStruct((M, nout), cdt),
        compiler_params=compiler_params(warps, stages), interpret=interpret,
        name="nsa_skinny_glu" if glu else ("nsa_skinny_norm" if norm is not None
                                           else "nsa_skinny"),
    )(*args)


def rms_norm(x, scale, eps: float, dtype):
    """flax ``nnx.RMSNorm`` (no mean, ``use_fast_variance``) in plain jnp: the twin of the
    kernels' prologue."""
    xf = x.astype(dtype).astype(jnp.float32)
    var = jnp.mean(xf * xf, axis=-1, keepdims=True)
    mul = lax.rsqrt(var + eps) * scale.astype(dtype).astype(jnp.float32)
    return (xf * mul).astype(dtype)


def skinny_reference(x, w, *, norm=None, residual=None, glu: bool = False):
    """The XLA expression :func:`skinny_matmul` fuses (same arguments, no tiles)."""
    cdt = w.dtype
    xin = rms_norm(x, norm[0], norm[1], cdt) if norm is not None else x.astype(cdt)
    y = jnp.dot(xin, w)
    if glu:
        a, b = jnp.split(y, 2, axis=-1)
        y = (jax.nn.silu(a.astype(jnp.float32)) * b.astype(jnp.float32)).astype(cdt)
    if residual is not None:
        y = (residual.astype(jnp.float32) + y.astype(jnp.float32)).astype(cdt)
    return y
