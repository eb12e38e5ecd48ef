"""The decode step's compressed-block emission as one Pallas kernel (issue 14).

When a compressed block ends at a row's position t (the l tokens up to t, i = (t - l + 1) / d an
integer), it is compressed by φ_K and φ_V (Eq. 7), the key is rotated at t (RoPE at the block's
last position, :mod:`nsa_jax.nsa.rope`), and both are written to the compressed caches at block
index i. The caller passes every row, with the caches' never-visible scratch slot as the index of
a row where no block ends (:mod:`nsa_jax.cache_update`). XLA ran that as ~10 small kernels per
layer (the position embedding add, two GEMMs per φ, SiLU, bias adds, RoPE and a cache-write
kernel); here it is two launches per layer: φ's hidden layer over (K or V) x (row tiles) x
(hidden-unit tiles) programs, then its output layer, the key's RoPE and the write over (K or V) x
(row tiles). With the decode cache's completion counters (``sync``, :mod:`nsa_jax.nsa.decoding`;
what the decoder passes) it is one: the hidden-layer program that completes a (K or V, row tile)
runs that tile's output layer, RoPE and write (``_fused_kernel``; 2.1 us per layer against 1.7 + 1.3
on an H100 at 64k / B=8, bench/NOTES.md, twentieth session).

A block ends at t for one step in d, so most steps emit nothing: rows bound for the scratch
slot are neither computed nor written (the slot is never read), and a program whose row tile
has no emitting row returns at once. With the rows of a batch at one position, d - 1 of d steps
do no φ work at all.

The arithmetic is :func:`nsa_jax.nsa.compression.compress_block`'s: the block plus the position
embedding in float32, rounded to the compute dtype; each GEMM accumulates in float32 and is
rounded, as is each bias add and each step of SiLU (sigmoid, product); the key's rotation is
computed in float32 from the rounded φ output and rounded (:func:`nsa_jax.nsa.rope.apply_rope`).
Float32 results equal XLA's within float rounding (IEEE float32 dots on the GPU, as in every
kernel here: ``common.dot_precision``); in bf16, XLA keeps some of those
intermediates in float32 inside its fusions, so the two differ by about a bf16 rounding and are
equally far from the float32 computation (tests/test_decode.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from nsa_jax.nsa.decoding import SYNC_PHI, SYNC_SLOTS
from nsa_jax.pallas.common import (MIN_DOT, cdiv, compiler_params, dot, dot_precision, load,
                                   next_pow2, rope_halves, store)

ROW_TILE = 32   # (row, group) pairs per program
H_TILE = 32     # φ hidden units per program of the first kernel
K_TILE = 256    # block features (of l*D) per step of φ's first GEMM
STAGES = 3      # Triton pipeline stages of that GEMM's loop (3 x 32 KB of shared memory)
# H200, 125M shape: 8.8 + 3.8 us per emission at B=64 and 7.5 + 2.8 at B=8 against 14.0 + 3.7 and
# 11.3 + 2.7 with 64 hidden units, 128-feature steps and 2 stages (bench/phi_decode.py,
# bench/NOTES.md, twelfth session); 16-row tiles with 512-feature steps were as fast at B=64 but
# need 160 KB of shared memory, at the edge of an A100's.


def applies(D: int, H: int, interpret: bool) -> bool:
    """Whether the kernels take this shape: Triton's dots need power-of-two dims >= 16 (the key's
    two rotation halves are D/2 wide); the CPU interpreter takes any."""
    ok = lambda n: n >= MIN_DOT and n == next_pow2(n)
    return interpret or (D % 2 == 0 and ok(D // 2) and ok(H))


def _by_branch(c, branch, k_args, v_args):
    """Program axis 0 picks the branch: ``branch(*k_args)`` for c = 0 (φ_K), ``*v_args`` for 1."""
    pl.when(c == 0)(lambda: branch(*k_args))
    pl.when(c == 1)(lambda: branch(*v_args))


def _tile_rows(idx_ref, p, R: int, BG: int, G: int, scratch: int):
    """Row tile p's (row, group) pairs -> (in range, batch row b, group g, block index i, emits:
    in range and i is not the scratch slot)."""
    r = p * R + jnp.arange(R)
    okr = r < BG
    rr = jnp.where(okr, r, 0)
    b, g = rr // G, rr % G
    i = load(idx_ref.at[b], okr, scratch)
    return okr, b, g, i, okr & (i != scratch)


def _any(mask):
    return jnp.max(mask.astype(jnp.int32)) > 0


def _hidden_kernel(*refs, **kw):
    """The first of the two launches: ``_hidden``."""
    _hidden(*refs, **kw)


def _hidden(idx_ref, kb_ref, vb_ref, pk_ref, w1k_ref, b1k_ref, pv_ref, w1v_ref, b1v_ref, h_ref, *,
            G, R, Ht, bk, prec, scratch):
    """h[c, rows, hidden tile] = SiLU(round(block + pos_emb) @ w1 + b1) for branch c (K, V) of the
    program (c, p, q): rows p*R.., hidden units q*Ht... Each program streams only its [l*D, Ht]
    slice of w1, so the GEMM is spread over (rows x hidden tiles) programs. A tile with no
    emitting row does nothing (its h is never read). -> whether the tile has an emitting row."""
    c, p, q = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    BG, F = kb_ref.shape
    dt = kb_ref.dtype
    f32 = jnp.float32
    okr, _, _, _, emits = _tile_rows(idx_ref, p, R, BG, G, scratch)
    ht = pl.ds(q * Ht, Ht)

    def branch(x_ref, pe_ref, w1_ref, b1_ref):
        def step(i, acc):
            okf = i * bk + jnp.arange(bk) < F
            x = load(x_ref.at[pl.ds(p * R, R), pl.ds(i * bk, bk)], okr[:, None] & okf[None, :])
            pe = load(pe_ref.at[pl.ds(i * bk, bk)], okf)
            blk = (x.astype(f32) + pe[None, :]).astype(dt)                # Eq. 7: + pos emb
            w = load(w1_ref.at[pl.ds(i * bk, bk), ht], okf[:, None]).astype(dt)
            return acc + dot(blk, w, precision=prec)

        acc = jax.lax.fori_loop(0, cdiv(F, bk), step, jnp.zeros((R, Ht), f32))
        h = (acc.astype(dt).astype(f32) + b1_ref[ht].astype(dt).astype(f32)[None, :]).astype(dt)
        sig = jax.nn.sigmoid(h.astype(f32)).astype(dt)                     # SiLU: x sigmoid(x)
        h = (h.astype(f32) * sig.astype(f32)).astype(dt)
        store(h_ref.at[c, pl.ds(p * R, R), ht], h, okr[:, None])

    any_emits = _any(emits)
    pl.when(any_emits)(lambda: _by_branch(c, branch, (kb_ref, pk_ref, w1k_ref, b1k_ref),
                                          (vb_ref, pv_ref, w1v_ref, b1v_ref)))
    return any_emits


def _out_tile(c, p, idx_ref, cos_ref, sin_ref, h_ref, w2k_ref, b2k_ref, w2v_ref, b2v_ref, kc_ref,
              vc_ref, *, G, R, prec, scratch):
    """Branch c's output h @ w2 + b2 for rows p*R.. in its two rotation halves, the key rotated,
    stored at each emitting row's block index (``idx``) of the aliased cache."""
    BG, H = h_ref.shape[1:]
    D = kc_ref.shape[-1]
    half = D // 2
    f32 = jnp.float32
    dt = h_ref.dtype
    okr, b, g, i, emits = _tile_rows(idx_ref, p, R, BG, G, scratch)
    dh = jnp.arange(half)
    bo = jnp.where(emits, b, kc_ref.shape[0])        # rows not written: out of bounds, dropped

    def branch(w2_ref, b2_ref, out_ref, rotate):
        h = load(h_ref.at[c, pl.ds(p * R, R), :], emits[:, None])

        def half_out(j):                                                   # φ's output columns
            o = dot(h, w2_ref[:, pl.ds(j * half, half)].astype(dt), precision=prec)
            o = o.astype(dt).astype(f32)
            return (o + b2_ref[pl.ds(j * half, half)].astype(dt).astype(f32)[None, :]
                    ).astype(dt).astype(f32)

        lo, hi = half_out(0), half_out(1)
        if rotate:                                                         # RoPE at t (Eq. 7)
            cs = load(cos_ref.at[b[:, None], dh[None, :]], okr[:, None])
            sn = load(sin_ref.at[b[:, None], dh[None, :]], okr[:, None])
            lo, hi = rope_halves(lo, hi, cs, sn)
        for j, val in enumerate((lo, hi)):
            store(out_ref.at[bo[:, None], g[:, None], i[:, None], (j * half + dh)[None, :]],
                  val.astype(out_ref.dtype), emits[:, None])

    pl.when(_any(emits))(lambda: _by_branch(c, branch, (w2k_ref, b2k_ref, kc_ref, True),
                                            (w2v_ref, b2v_ref, vc_ref, False)))


def _out_kernel(idx_ref, cos_ref, sin_ref, h_ref, w2k_ref, b2k_ref, w2v_ref, b2v_ref, kc_in, vc_in,
                kc_ref, vc_ref, **kw):
    """The output layer, RoPE and the write of program (c, p)'s rows (``_out_tile``)."""
    del kc_in, vc_in
    _out_tile(pl.program_id(0), pl.program_id(1), idx_ref, cos_ref, sin_ref, h_ref, w2k_ref,
              b2k_ref, w2v_ref, b2v_ref, kc_ref, vc_ref, **kw)


def _fused_kernel(idx_ref, kb_ref, vb_ref, pk_ref, w1k_ref, b1k_ref, pv_ref, w1v_ref, b1v_ref,
                  cos_ref, sin_ref, w2k_ref, b2k_ref, w2v_ref, b2v_ref, kc_in, vc_in, sync_in,
                  h_ref, kc_ref, vc_ref, sync_ref, *, G, R, Ht, bk, prec, scratch, interpret):
    """``_hidden_kernel``, then the output layer (``_out_tile``) in the program that completes a
    (branch, row tile): where the tile has an emitting row, each of its H / Ht programs adds 1 to
    the tile's counter in ``sync`` (slot SYNC_PHI + c of the tile's first (row, group); a CTA
    barrier first, so every thread's h stores precede the acquire-release add), and the one that
    sees H / Ht - 1 earlier arrivals computes the tile's output from all of h and sets the
    counter back to 0. One launch per layer instead of two; a step where no row emits returns at
    once from every program (bench/NOTES.md, twentieth session)."""
    del kc_in, vc_in, sync_in                              # aliased to kc_ref, vc_ref, sync_ref
    any_emits = _hidden(idx_ref, kb_ref, vb_ref, pk_ref, w1k_ref, b1k_ref, pv_ref, w1v_ref,
                        b1v_ref, h_ref, G=G, R=R, Ht=Ht, bk=bk, prec=prec, scratch=scratch)
    c, p = pl.program_id(0), pl.program_id(1)
    r0 = p * R                                             # the tile's first (row, group)
    b0, g0 = r0 // G, r0 % G

    @pl.when(any_emits)
    def _():
        if not interpret:
            plgpu.debug_barrier()
        slot = SYNC_PHI + c
        arrived = plgpu.atomic_add(sync_ref, (b0, g0, slot), jnp.ones((), jnp.int32))

        @pl.when(arrived == pl.num_programs(2) - 1)
        def _():
            _out_tile(c, p, idx_ref, cos_ref, sin_ref, h_ref, w2k_ref, b2k_ref, w2v_ref, b2v_ref,
                      kc_ref, vc_ref, G=G, R=R, prec=prec, scratch=scratch)
            sync_ref[b0, g0, slot] = jnp.zeros((), jnp.int32)


def emit_pallas(k_cmp, v_cmp, kb, vb, idx, cos, sin, phi_k, phi_v, *, interpret: bool,
                rows: int = ROW_TILE, h_tile: int = H_TILE, k_tile: int = K_TILE,
                stages: int = STAGES, warps: int = 4, sync=None):
    """Compressed caches ``k_cmp``, ``v_cmp`` [B,G,Tc,D] (updated in place) with φ_K(kb) rotated
    by (cos, sin) and φ_V(vb) written at block index ``idx`` [B] of each row; a row whose idx is
    the caches' last slot (the decoder's scratch slot: no block ends at its position) is skipped
    and its caches are left as they are.

    kb, vb [B,G,l,D]: each row's un-rotated block (token order, the cache-write kernel's ring
    readout); cos, sin [B, D/2] float32: the rotation at the block's last position; ``phi_k``,
    ``phi_v``: (pos_emb [l,D], w1 [l*D,H], b1 [H], w2 [H,D], b2 [D]), cast to kb's dtype in the
    kernels (pos_emb stays float32). Without ``sync``, two launches: the hidden layer over (K/V,
    row tiles, hidden tiles) programs, then the output layer, RoPE and the cache write. ``rows``,
    ``h_tile``, ``k_tile``, ``stages``, ``warps``: the first kernel's tiles (powers of two) and its
    Triton pipeline depth and warps (bench/phi_decode.py sweeps them).

    ``sync``: the layer's completion counters (int32 [B,G,SYNC_SLOTS], all 0: the decode cache's
    ``sync``); given, the output layer runs in the first kernel's completing programs
    (``_fused_kernel``: one launch) and the result is (k_cmp, v_cmp, sync), the counters 0 again."""
    B, G, l, D = kb.shape
    F, BG = l * D, B * G
    H = phi_k[1].shape[-1]
    R = min(rows, max(MIN_DOT, next_pow2(BG)))
    Ht = min(h_tile, H)
    if H % Ht:
        raise ValueError(f"h_tile={h_tile} must divide φ's hidden width {H}")
    bk = min(k_tile, next_pow2(F))
    prec = dot_precision(kb.dtype, interpret)
    f32 = jnp.float32
    idx = jnp.asarray(idx, jnp.int32)
    scratch = k_cmp.shape[2] - 1
    first = [idx, kb.reshape(BG, F), vb.reshape(BG, F)]
    for pe, w1, b1, _, _ in (phi_k, phi_v):
        first += [pe.astype(f32).reshape(F), w1, b1]
    rope = [cos.astype(f32), sin.astype(f32)]
    out_layer = [phi_k[3], phi_k[4], phi_v[3], phi_v[4], k_cmp, v_cmp]   # w2, b2 (K, V), caches
    if sync is not None:
        if sync.shape != (B, G, SYNC_SLOTS) or sync.dtype != jnp.int32:
            raise ValueError(f"sync: int32 [{B}, {G}, {SYNC_SLOTS}] counters, got {sync.dtype} "
                             f"{sync.shape}")
        args = first + rope + out_layer + [sync]
        out = pl.pallas_call(
            functools.partial(_fused_kernel, G=G, R=R, Ht=Ht, bk=bk, prec=prec, scratch=scratch,
                              interpret=interpret),
            grid=(2, cdiv(BG, R), H // Ht),
            out_shape=[jax.ShapeDtypeStruct((2, BG, H), kb.dtype),
                       jax.ShapeDtypeStruct(k_cmp.shape, k_cmp.dtype),
                       jax.ShapeDtypeStruct(v_cmp.shape, v_cmp.dtype),
                       jax.ShapeDtypeStruct(sync.shape, sync.dtype)],
            input_output_aliases={len(args) - 3: 1, len(args) - 2: 2, len(args) - 1: 3},
            compiler_params=compiler_params(warps, stages), interpret=interpret,
            name="nsa_decode_phi",
        )(*args)
        return tuple(out[1:])
    h = pl.pallas_call(
        functools.partial(_hidden_kernel, G=G, R=R, Ht=Ht, bk=bk, prec=prec, scratch=scratch),
        grid=(2, cdiv(BG, R), H // Ht),
        out_shape=jax.ShapeDtypeStruct((2, BG, H), kb.dtype),
        compiler_params=compiler_params(warps, stages), interpret=interpret,
        name="nsa_decode_phi_h",
    )(*first)
    second = [idx, *rope, h, *out_layer]
    out = pl.pallas_call(
        functools.partial(_out_kernel, G=G, R=R, prec=prec, scratch=scratch),
        grid=(2, cdiv(BG, R)),
        out_shape=[jax.ShapeDtypeStruct(k_cmp.shape, k_cmp.dtype),
                   jax.ShapeDtypeStruct(v_cmp.shape, v_cmp.dtype)],
        input_output_aliases={8: 0, 9: 1},
        compiler_params=compiler_params(4, 1), interpret=interpret, name="nsa_decode_phi_out",
    )(*second)
    return tuple(out)
