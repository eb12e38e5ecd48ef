"""The decode step's dense layers as Pallas kernels: RMSNorm, projections, SwiGLU, residuals.

One token per batch row: a block's activations are [B, dim] with B small, so each of its
matmuls is a stream of the weight matrix past a few rows. XLA ran a block's step as four GEMMs
and seven small elementwise kernels (two RMSNorm reductions and converts, two residual adds,
the SwiGLU product; dense three more, concatenating its wq and wkv each step), each one launch
and one memory round trip (bench/NOTES.md, forty-fourth session). Here a block's step is four
kernels, each a weight stream over column tiles with every program holding all B rows:

* :func:`norm_linear`: y = RMSNorm(x) @ W (the attention's step projection, one [dim, N]
  matrix for q, K/V and the gates: ``fuse_step_weights``);
* :func:`linear_add`: x + a @ W (the output projection and the MLP's w_out with the residual);
* :func:`norm_swiglu`: silu(u_a) * u_b with [u_a | u_b] = RMSNorm(x) @ W (the MLP's w_in).

Values follow the modules' (``flax.nnx`` RMSNorm and Linear, :func:`nsa_jax.swiglu.swiglu`): the
norm's statistics in float32, y = x * (rsqrt(mean(x^2) + eps) * scale) rounded to x's dtype;
each matmul accumulates in float32 and is rounded once; the residual add, the sigmoid and each
product of SwiGLU rounded as the jax expressions are. Float32 equals XLA up to the order of the
accumulation; in bf16 the two may differ by a rounding where XLA keeps a fusion's intermediate
in float32 (tests/test_decode_layers.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import (MIN_DOT, cdiv, compiler_params, dot, dot_precision, load,
                                   next_pow2, store, use_interpret)

ROWS = 64       # batch rows per program at most (fewer rows: padded to a power of two >= 16)
COLS = 16       # output columns per program
K_STEP = 256    # input features per step of the weight stream
STAGES = 3      # Triton pipeline stages of that stream (the loop form)
WARPS = 4
UNROLL = True   # the K loop unrolled, all loads first (else a pipelined loop)



def _tiles(B: int, N: int, K: int, cols: int, k_step: int):
    """(rows per program, columns per program, features per step): powers of two >= 16."""
    bm = min(ROWS, max(MIN_DOT, next_pow2(B)))
    bn = max(MIN_DOT, min(next_pow2(cols), next_pow2(N)))
    bk = max(MIN_DOT, min(next_pow2(k_step), next_pow2(K)))
    return bm, bn, bk


def _inv_rms(x_ref, r0, okr, K, bk, eps):
    """rsqrt(mean(x^2) + eps) [bm] of the rows from ``r0`` in float32 (the RMSNorm statistic)."""
    bm = okr.shape[0]

    def step(k, acc):
        okk = k * bk + jnp.arange(bk) < K
        x = load(x_ref.at[pl.ds(r0, bm), pl.ds(k * bk, bk)],
                 okr[:, None] & okk[None, :]).astype(jnp.float32)
        return acc + jnp.sum(x * x, axis=1)

    ss = lax.fori_loop(0, cdiv(K, bk), step, jnp.zeros((bm,), jnp.float32))
    return lax.rsqrt(ss / K + eps)


def _silu_times(a, b):
    """silu(a) * b as jax evaluates it in a's dtype: sigmoid(a) = 1 / (1 + exp(-a)) and each of
    its steps, a * sigmoid(a) and the product with b rounded to the dtype (bitwise XLA's on the
    CPU under jax 0.10.2; tests/test_decode_layers.py)."""
    dt, f32 = a.dtype, jnp.float32
    rnd = lambda v: v.astype(dt).astype(f32)                              # noqa: E731
    a32 = a.astype(f32)
    sig = rnd(1.0 / rnd(1.0 + rnd(jnp.exp(-a32))))
    return (rnd(a32 * sig) * b.astype(f32)).astype(dt)


def _kernel(*refs, mode, eps, bm, bn, bk, half, prec, unroll):
    """Program (i, j): rows i*bm.., output columns j*bn.. of

    * ``mode`` "norm": RMSNorm(x) @ W;      refs x, scale, W, out
    * ``mode`` "swiglu": silu(a) * b with a = RMSNorm(x) @ W[:, cols], b = ... @ W[:, half + cols];
      refs x, scale, W, out
    * ``mode`` "add": res + x @ W;          refs x, W, res, out

    Loads are contiguous slices (``pl.ds``) with masks at the edges, so Triton can vectorise
    them (clamped index arrays hid the contiguity: 2-5x slower, bench/NOTES.md, forty-fourth
    session); stores go through index arrays with masked entries out of bounds (dropped).
    """
    if mode == "add":
        x_ref, w_ref, r_ref, o_ref = refs
    else:
        x_ref, s_ref, w_ref, o_ref = refs
    i, j = pl.program_id(0), pl.program_id(1)
    B, K = x_ref.shape
    N = o_ref.shape[1]
    dt = x_ref.dtype
    f32 = jnp.float32
    r0, c0 = i * bm, j * bn
    r = r0 + jnp.arange(bm)
    okr = r < B
    c = c0 + jnp.arange(bn)
    okc = c < N
    n_acc = 2 if mode == "swiglu" else 1
    zeros = tuple(jnp.zeros((bm, bn), f32) for _ in range(n_acc))

    def chunk(k):
        """K chunk k -> (start, mask). Unrolled (k an int), the last chunk starts at K - bk and
        masks what the one before covered: a static slice must lie inside the ref."""
        if isinstance(k, int) and K > bk:
            start = min(k * bk, K - bk)
            return start, start + jnp.arange(bk) >= k * bk
        return k * bk, k * bk + jnp.arange(bk) < K

    def x_tile(k):
        k0, okk = chunk(k)
        return load(x_ref.at[pl.ds(r0, bm), pl.ds(k0, bk)], okr[:, None] & okk[None, :])

    def w_tiles(k):
        k0, okk = chunk(k)
        return [load(w_ref.at[pl.ds(k0, bk), pl.ds(off + c0, bn)], okk[:, None] & okc[None, :])
                for off in (0, half)[:n_acc]]

    def normed(k, x, inv):                        # flax RMSNorm: x * (rsqrt(var + eps) * scale)
        if inv is None:
            return x
        k0, okk = chunk(k)
        s = load(s_ref.at[pl.ds(k0, bk)], okk).astype(dt).astype(f32)         # x's dtype
        return (x.astype(f32) * (inv[:, None] * s[None, :])).astype(dt)

    def mma(accs, x, ws):
        return tuple(a + dot(x, w.astype(dt), precision=prec) for a, w in zip(accs, ws))

    nk = cdiv(K, bk)
    if unroll:        # every load issued before the first dot; the norm from the same x tiles
        xs = [x_tile(k) for k in range(nk)]
        ws = [w_tiles(k) for k in range(nk)]
        inv = None
        if mode != "add":
            ss = sum(jnp.sum(jnp.square(x.astype(f32)), axis=1) for x in xs)
            inv = lax.rsqrt(ss / K + eps)
        accs = zeros
        for k in range(nk):
            accs = mma(accs, normed(k, xs[k], inv), ws[k])
    else:             # a software-pipelined loop over K (the norm's statistic in a pass before)
        inv = None if mode == "add" else _inv_rms(x_ref, r0, okr, K, bk, eps)
        accs = lax.fori_loop(0, nk, lambda k, a: mma(a, normed(k, x_tile(k), inv), w_tiles(k)),
                             zeros)
    y = accs[0].astype(dt)
    if mode == "swiglu":
        y = _silu_times(y, accs[1].astype(dt))
    elif mode == "add":
        res = load(r_ref.at[pl.ds(r0, bm), pl.ds(c0, bn)], okr[:, None] & okc[None, :])
        y = (res.astype(f32) + y.astype(f32)).astype(dt)
    store(o_ref.at[jnp.where(okr, r, B)[:, None], jnp.where(okc, c, N)[None, :]], y,
          okr[:, None] & okc[None, :])


def _call(mode, args, B, K, N, dtype, *, eps=0.0, half=0, cols=COLS, k_step=K_STEP,
          stages=STAGES, warps=WARPS, unroll=UNROLL, name):
    interpret = use_interpret()
    bm, bn, bk = _tiles(B, N, K, cols, k_step)
    kern = functools.partial(_kernel, mode=mode, eps=float(eps), bm=bm, bn=bn, bk=bk, half=half,
                             prec=dot_precision(dtype, interpret), unroll=bool(unroll))
    return pl.pallas_call(
        kern, grid=(cdiv(B, bm), cdiv(N, bn)),
        out_shape=jax.ShapeDtypeStruct((B, N), dtype),
        compiler_params=compiler_params(warps, stages), interpret=interpret, name=name,
    )(*args)


def _check(name, x, w, k_axis_of_w=0, **kw):
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[k_axis_of_w]:
        raise ValueError(f"{name}: x [B, K] and a [K, N] weight, got x {x.shape}, "
                         f"weight {w.shape}")
    for key, v in kw.items():
        if key == "unroll":
            if not isinstance(v, bool):
                raise ValueError(f"{name}: unroll must be true or false, got {v!r}")
        elif v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: {key} must be a positive int, got {v!r}")


def norm_linear(x, scale, eps: float, w, **tiles):
    """RMSNorm(x) @ w: x [B, K] (the residual stream), scale [K], w [K, N] -> [B, N] in x's
    dtype. ``tiles``: ``cols``, ``k_step`` (rounded up to powers of two >= 16), ``stages``,
    ``warps``, ``unroll`` (the K loop unrolled with every load issued first, or a pipelined
    loop; ``bench/decode_layers.py`` sweeps them)."""
    _check("norm_linear", x, w, **tiles)
    if scale.shape != (x.shape[1],):
        raise ValueError(f"norm_linear: scale [K={x.shape[1]}], got {scale.shape}")
    B, K = x.shape
    return _call("norm", (x, scale, w), B, K, w.shape[1], x.dtype, eps=eps, **tiles,
                 name="nsa_decode_norm_linear")


def norm_swiglu(x, scale, eps: float, w, **tiles):
    """silu(a) * b with [a | b] = RMSNorm(x) @ w: x [B, K], scale [K], w [K, 2H] -> [B, H]."""
    _check("norm_swiglu", x, w, **tiles)
    if scale.shape != (x.shape[1],) or w.shape[1] % 2:
        raise ValueError(f"norm_swiglu: scale [K={x.shape[1]}] and w [K, 2H], got scale "
                         f"{scale.shape}, w {w.shape}")
    B, K = x.shape
    H = w.shape[1] // 2
    return _call("swiglu", (x, scale, w), B, K, H, x.dtype, eps=eps, half=H, **tiles,
                 name="nsa_decode_norm_swiglu")


def linear_add(a, w, res, **tiles):
    """res + a @ w: a [B, K], w [K, N], res [B, N] -> [B, N] in res's dtype (a is cast to it)."""
    _check("linear_add", a, w, **tiles)
    B, K = a.shape
    if res.shape != (B, w.shape[1]):
        raise ValueError(f"linear_add: res [B={B}, N={w.shape[1]}], got {res.shape}")
    return _call("add", (a.astype(res.dtype), w, res), B, K, w.shape[1], res.dtype, **tiles,
                 name="nsa_decode_linear_add")
