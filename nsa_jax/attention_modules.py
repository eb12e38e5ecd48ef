"""The attention modules of :mod:`nsa_jax.model`, and how their decode steps are dispatched.

``NSAAttention`` owns the shared query projection, one K and one V projection per branch
(cmp, slc, win; fused into a single matmul), the compression MLPs φ_K and φ_V (Eq. 7), and the
per-head sigmoid gates, and calls :func:`nsa_jax.nsa.nsa_attention`; ``DenseAttention`` is causal
GQA attention (cuDNN on GPU). Both take and return their KV cache (``(x, positions, cache) ->
(out, cache)``): decoding is a mode of the model. RoPE placement is documented in
:mod:`nsa_jax.nsa.rope`.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from nsa_jax import cache_update
from nsa_jax import decode as kvcache
from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.dense_packed import dense_packed_attention
from nsa_jax.nsa import NSAConfig, nsa_attention, semantics
from nsa_jax.nsa.chunked import dense_chunk_attention, nsa_chunk_attention
from nsa_jax.nsa.decoding import dense_decode_attention
from nsa_jax.nsa.compression import compress, compress_block
from nsa_jax.nsa.rope import apply_rope, cmp_positions, cos_sin
from nsa_jax.parallel import batch_parallel

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def resolve_nsa_impl(impl: str) -> str:
    """The backend name ``model.nsa_impl`` resolves to (``nsa_jax.nsa.resolve_impl``: ``auto``
    -> ``pallas`` on GPU, ``reference`` elsewhere; no silent fallback)."""
    from nsa_jax.nsa.attention import resolve_impl
    return resolve_impl(impl).value


def nsa_decode(q, kv, t, gates, cfg: NSAConfig, impl: str):
    """One decode step's NSA attention (q [B,Hq,D] at positions t [B]) by ``exec.decode_impl``
    (resolved the same way as ``nsa_impl``)."""
    from nsa_jax.nsa.attention import Backend, resolve_impl
    if resolve_impl(impl) is Backend.PALLAS:
        from nsa_jax.pallas.decode import nsa_decode_pallas
        return nsa_decode_pallas(q, kv, t, gates, cfg)
    from nsa_jax.nsa.decoding import nsa_decode_attention
    return nsa_decode_attention(q, kv, t, gates, cfg)


def dense_decode(q, k, v, t, impl: str):
    """One decode step's dense attention (q [B,Hq,D] at positions t [B] over caches [B,G,S,D])
    by ``exec.decode_impl``, as the NSA step: the Pallas flash-decoding kernel
    (``pallas.decode_dense``) where it resolves to Pallas, else XLA (the same treatment for
    both models, so the benchmark compares like with like)."""
    from nsa_jax.nsa.attention import Backend, resolve_impl
    if resolve_impl(impl) is Backend.PALLAS:
        from nsa_jax.pallas.decode_dense import dense_decode_pallas
        return dense_decode_pallas(q, k, v, t)
    return dense_decode_attention(q, k, v, t)


def fused_writes(impl: str):
    """The decode step's cache writes: None (XLA scatters) unless ``exec.decode_impl`` resolves to
    the Pallas kernels, then the interpret flag of ``pallas.cache_write`` (one kernel per layer
    for the token writes; dense layers get the same treatment, for a fair comparison)."""
    from nsa_jax.nsa.attention import Backend, resolve_impl
    if resolve_impl(impl) is not Backend.PALLAS:
        return None
    from nsa_jax.pallas.common import use_interpret
    return use_interpret()


def _no_packed_cache(cache, segment_ids):
    if cache is not None and segment_ids is not None:
        raise ValueError("segment_ids: packed documents are not supported with a KV cache "
                         "(decoding runs one document per row)")


def _normal(std):
    return nnx.initializers.normal(stddev=std)


class Compressor(nnx.Module):
    """φ (Eq. 7): MLP over a flattened block of l keys plus an intra-block position embedding."""

    def __init__(self, cfg: NSAConfig, dim_in: int, dim_out: int, hidden: int, dtype, *,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.dtype = dtype
        l = cfg.block_l
        self.pos_emb = nnx.Param(_normal(0.02)(rngs.params(), (l, dim_in), jnp.float32))
        self.w1 = nnx.Param(_normal(1.0 / math.sqrt(l * dim_in))(rngs.params(), (l * dim_in, hidden),
                                                                  jnp.float32))
        self.b1 = nnx.Param(jnp.zeros((hidden,), jnp.float32))
        self.w2 = nnx.Param(_normal(1.0 / math.sqrt(hidden))(rngs.params(), (hidden, dim_out),
                                                             jnp.float32))
        self.b2 = nnx.Param(jnp.zeros((dim_out,), jnp.float32))

    def __call__(self, x, src=None):  # [B,T,G,D] -> [B,Tc,G,Dout]; src: packed documents
        return compress(x.astype(self.dtype), self.pos_emb[...], self.w1[...], self.b1[...],
                        self.w2[...], self.b2[...], self.cfg, src=src)

    def block(self, x):  # one block per row: [B,G,l,D] -> [B,1,G,Dout] (decoding)
        return compress_block(x.astype(self.dtype), self.pos_emb[...], self.w1[...],
                              self.b1[...], self.w2[...], self.b2[...])


def _in_projections(mcfg: ModelConfig, kv_outputs: int, rngs: nnx.Rngs):
    """-> (compute dtype, wq, wkv) of an attention module: wkv has ``kv_outputs`` x G x D outputs
    (dense: k, v; NSA: k and v of each of its three branches)."""
    dt = DTYPES[mcfg.compute_dtype]
    H, G, D, std = mcfg.n_heads, mcfg.n_kv_groups, mcfg.head_dim, mcfg.init_std
    wq = nnx.Linear(mcfg.dim, H * D, use_bias=False, dtype=dt, kernel_init=_normal(std), rngs=rngs)
    wkv = nnx.Linear(mcfg.dim, kv_outputs * G * D, use_bias=False, dtype=dt,
                     kernel_init=_normal(std), rngs=rngs)
    return dt, wq, wkv


def _out_projection(mcfg: ModelConfig, rngs: nnx.Rngs):
    """wo, its init scaled by 1 / sqrt(2 n_layers). (Each module draws its parameters' keys in
    the order it always has: NSA wq, wkv, wg, φ, wo; dense wq, wkv, wo.)"""
    return nnx.Linear(mcfg.n_heads * mcfg.head_dim, mcfg.dim, use_bias=False,
                      dtype=DTYPES[mcfg.compute_dtype],
                      kernel_init=_normal(mcfg.init_std / math.sqrt(2 * mcfg.n_layers)), rngs=rngs)


class StepWeight(nnx.Variable):
    """A decode-step-only weight (:meth:`_StepWeights.fuse_step_weights`)."""


class _StepWeights:
    """The decode step's projections (``step_projections``) as one matrix ``w_step``, for both
    attention modules, so the dense model's step gets the NSA step's treatment (XLA merged the
    matmuls itself and then sliced q and K/V out of its output, and rotated them, in more kernels
    per layer; bench/NOTES.md, thirteenth and forty-fourth sessions)."""

    def fuse_step_weights(self):
        """Add ``w_step``: the ``step_projections`` kernels side by side (added by
        :func:`nsa_jax.decode.step_state` to a copy of the model used for the decode steps only;
        training and prefill never see it)."""
        self.w_step = StepWeight(jnp.concatenate(
            [lin.kernel[...] for lin in self.step_projections()], axis=1))

    def _step_matmul(self, x):
        """x [B,1,dim] @ ``w_step`` in the compute dtype -> [B, outputs]."""
        return jnp.dot(x[:, 0].astype(self.dtype), self.w_step[...].astype(self.dtype))


class NSAAttention(_StepWeights, nnx.Module):
    def __init__(self, mcfg: ModelConfig, ncfg: NSAConfig, *, rngs: nnx.Rngs,
                 xcfg: ExecConfig | None = None):
        self.mcfg, self.ncfg, self.xcfg = mcfg, ncfg, xcfg or ExecConfig()
        # k and v for each branch (cmp, slc, win): 6 * G * D outputs in one matmul
        self.dtype, self.wq, self.wkv = _in_projections(mcfg, 6, rngs)
        dt = self.dtype
        H, D = mcfg.n_heads, mcfg.head_dim
        std = mcfg.init_std
        # gate logits [H, 3] flattened head-major; bias (cmp, slc, win) = model.gate_bias per head
        gate_b = jnp.tile(jnp.asarray(mcfg.gate_bias, jnp.float32), H)
        self.wg = nnx.Linear(mcfg.dim, H * 3, use_bias=True, dtype=dt, kernel_init=_normal(std),
                             bias_init=lambda *_: gate_b, rngs=rngs)
        hidden = mcfg.phi_hidden or 4 * D
        self.phi_k = Compressor(ncfg, D, D, hidden, dt, rngs=rngs)
        self.phi_v = Compressor(ncfg, D, D, hidden, dt, rngs=rngs)
        self.wo = _out_projection(mcfg, rngs)

    def project_raw(self, x, positions):
        """Projections and RoPE, before φ: ``(q, k_c, v_c, k_s, v_s, k_w, v_w, gates)``.

        ``k_c, v_c`` are the un-rotated cmp-branch keys/values [B,T,G,D] that φ compresses; the
        decoder (:mod:`nsa_jax.decode`) keeps them to form compressed blocks incrementally.
        """
        B, T, _ = x.shape
        m = self.mcfg
        H, G, D = m.n_heads, m.n_kv_groups, m.head_dim
        q = apply_rope(self.wq(x).reshape(B, T, H, D), positions, m.rope_theta)
        kv = self.wkv(x).reshape(B, T, 6, G, D)
        k_c, v_c, k_s, v_s, k_w, v_w = (kv[:, :, i] for i in range(6))
        k_s = apply_rope(k_s, positions, m.rope_theta)
        k_w = apply_rope(k_w, positions, m.rope_theta)
        return q, k_c, v_c, k_s, v_s, k_w, v_w, self._gates(x)

    def _gates(self, x):
        """Gate values g_c [B,T,H,3] (Eq. 5: sigmoid), ablated branches zeroed."""
        B, T, _ = x.shape
        gates = jax.nn.sigmoid(self.wg(x).astype(jnp.float32)).reshape(B, T, self.mcfg.n_heads, 3)
        return (gates * jnp.asarray(self.ncfg.branch_mask())).astype(self.dtype)

    def step_projections(self):
        """The projections the decode step runs as one matrix (``w_step`` = [wq | wkv | wg]
        [dim, H*D + 6*G*D + 3H], :class:`_StepWeights`)."""
        return self.wq, self.wkv, self.wg

    def project_step(self, x, t, fused: bool = False):
        """The decode step's projections (x [B,1,dim] at positions t [B]), un-rotated: q [B,H,D];
        the K/V projection as one [B,6,G,D] array in ``cache_update.ROWS`` order (the
        cache-write kernel reads it whole: no per-cache slice copies); gates [B,H,3]; and RoPE's
        (cos, sin) [B, D/2] at t, with which ``cache_update.append_nsa`` rotates q and the keys.

        ``fused`` (the Pallas decode path) with ``w_step`` (:meth:`fuse_step_weights`): one
        matmul for all three; q and the K/V projection as ``cache_write.Columns`` of its output,
        which the cache-write kernel reads in place (XLA merged the three matmuls anyway and
        then copied q and K/V out of its output: two kernels per layer), and the gates as
        ``pallas.decode.GateLogits`` of it, whose sigmoid the finishing kernel applies (one
        more kernel per layer). Same values up to the matmul's rounding (bench/NOTES.md,
        thirteenth session)."""
        B = x.shape[0]
        m = self.mcfg
        H, G, D = m.n_heads, m.n_kv_groups, m.head_dim
        rope = cos_sin(t, D, m.rope_theta)
        if fused and hasattr(self, "w_step"):
            from nsa_jax.pallas.cache_write import Columns
            from nsa_jax.pallas.decode import GateLogits
            P = self._step_matmul(x)
            n_q, n_kv = H * D, 6 * G * D
            gates = GateLogits(Columns(P, n_q + n_kv, (3 * H,)), self.wg.bias[...], self.dtype)
            return Columns(P, 0, (H, D)), Columns(P, n_q, (6, G, D)), gates, rope
        q = self.wq(x).reshape(B, H, D)
        kv = self.wkv(x).reshape(B, 6, G, D)
        return q, kv, self._gates(x)[:, 0], rope

    def compress_kv(self, k_c, v_c, offset=0):
        """φ_K, φ_V (Eq. 7) over un-rotated tokens starting at position ``offset`` (a multiple of
        d), then RoPE on compressed key i at ``offset + i*d + l - 1``. -> (k_cmp, v_cmp)."""
        k_cmp = self.phi_k(k_c)
        v_cmp = self.phi_v(v_c)
        Tc = k_cmp.shape[1]
        if Tc:
            offset = jnp.asarray(offset)
            pos = cmp_positions(Tc, self.ncfg.block_l, self.ncfg.stride_d,
                                offset[..., None] if offset.ndim else offset)
            k_cmp = apply_rope(k_cmp, pos, self.mcfg.rope_theta)
        return k_cmp, v_cmp

    def compress_documents(self, k_c, v_c, positions, layout: semantics.SegmentLayout):
        """Packed documents: φ over each document's own blocks into the per-document slot
        layout (``layout.cmp_src``), then RoPE on the key in slot c at the position of its
        block's last token, ``positions[cmp_src[c] + l - 1]`` (document-relative
        i*d + l - 1 with the default positions). -> (k_cmp, v_cmp) [B,Tc,G,D]."""
        k_cmp = self.phi_k(k_c, layout.cmp_src)
        v_cmp = self.phi_v(v_c, layout.cmp_src)
        B, T = k_c.shape[:2]
        if k_cmp.shape[1]:
            pos = jnp.broadcast_to(jnp.asarray(positions), (B, T))
            last = jnp.minimum(layout.cmp_src + self.ncfg.block_l - 1, T - 1)
            k_cmp = apply_rope(k_cmp, jnp.take_along_axis(pos, last, axis=1),
                               self.mcfg.rope_theta)
        return k_cmp, v_cmp

    def compress_block(self, kb, vb, offset):
        """φ of one block per row (un-rotated [B,G,l,D] starting at offset [B]) + RoPE at its
        last position: the decoder's emission. -> (k_cmp, v_cmp) [B,1,G,D]."""
        pos = (jnp.asarray(offset) + self.ncfg.block_l - 1)[:, None]
        return apply_rope(self.phi_k.block(kb), pos, self.mcfg.rope_theta), self.phi_v.block(vb)

    def emit_block(self, k_cmp, v_cmp, kb, vb, offset, idx, interpret: bool, sync=None):
        """:meth:`compress_block` and the write of its output at block index ``idx`` [B] into the
        compressed caches in Pallas (``pallas.phi_decode``; the Pallas decode path); with the
        cache's completion counters ``sync``, one launch, and they come back last."""
        from nsa_jax.pallas import phi_decode
        cos, sin = cos_sin(jnp.asarray(offset) + self.ncfg.block_l - 1, self.mcfg.head_dim,
                           self.mcfg.rope_theta)
        prm = lambda c: (c.pos_emb[...], c.w1[...], c.b1[...], c.w2[...], c.b2[...])
        return phi_decode.emit_pallas(k_cmp, v_cmp, kb.astype(self.dtype), vb.astype(self.dtype),
                                      idx, cos, sin, prm(self.phi_k), prm(self.phi_v),
                                      interpret=interpret, sync=sync)

    def _emitter(self, interpret: bool | None):
        """:meth:`emit_block` where the fused kernel takes this shape, else None (φ in XLA)."""
        from nsa_jax.pallas import phi_decode
        H = self.phi_k.w1.shape[-1]
        if interpret is None or not phi_decode.applies(self.mcfg.head_dim, H, interpret):
            return None
        return self.emit_block

    def project(self, x, positions):
        """Projections, φ and RoPE. Returns the 8 inputs of ``nsa_attention``."""
        q, k_c, v_c, k_s, v_s, k_w, v_w, gates = self.project_raw(x, positions)
        k_cmp, v_cmp = self.compress_kv(k_c, v_c)
        return q, k_cmp, v_cmp, k_s, v_s, k_w, v_w, gates

    def __call__(self, x, positions, cache: kvcache.LayerCache | None = None, segment_ids=None):
        """x [B,S,dim] -> (out [B,S,dim], cache).

        Without a cache: the parallel (training) forward. With one: S == 1 appends one token per
        row at position ``cache.pos`` and attends over the cache (decode step); S > 1 is a prefill
        of an empty cache with ``cache.n`` valid tokens per row, or, with ``cache.start`` set,
        a continuation chunk of a chunked prefill (:meth:`_extend`). ``segment_ids`` [B,S] packs
        documents (no cache): each attends only inside itself (:mod:`nsa_jax.nsa.semantics`).
        """
        B, S, _ = x.shape
        _no_packed_cache(cache, segment_ids)
        if cache is not None and cache.start is not None:
            return self._extend(x, positions, cache)
        if cache is not None and S == 1:
            return self._decode(x, cache, self.xcfg.decode_impl)
        impl = resolve_nsa_impl(self.xcfg.nsa_impl)
        q, k_c, v_c, k_s, v_s, k_w, v_w, gates = self.project_raw(x, positions)
        if segment_ids is None:
            k_cmp, v_cmp = self.compress_kv(k_c, v_c)
        else:
            k_cmp, v_cmp = self.compress_documents(
                k_c, v_c, positions, semantics.segment_layout(segment_ids, self.ncfg))
        args = (q, k_cmp, v_cmp, k_s, v_s, k_w, v_w, gates)
        kw = dict(impl=impl, choices=self.xcfg.kernel)
        if segment_ids is None:
            o = batch_parallel(lambda *a: nsa_attention(*a, self.ncfg, **kw), *args)
        else:
            o = batch_parallel(lambda *a: nsa_attention(*a[:-1], self.ncfg, segment_ids=a[-1],
                                                        **kw), *args, segment_ids)
        out = self.wo(o.reshape(B, S, -1).astype(self.dtype))
        if cache is None:
            return out, None
        kv = cache_update.fill_nsa(cache.kv, cache.n, k_c, v_c, k_cmp, v_cmp, k_s, v_s, k_w, v_w)
        return out, dataclasses.replace(cache, kv=kv)

    def _extend(self, x, positions, cache: kvcache.LayerCache):
        """A continuation chunk of a chunked prefill (x [B,C,dim] at ``positions`` [C] =
        cache.start + 0..C-1): its tokens into the caches (``cache_update.extend_nsa``), then
        its queries over them: the Pallas kernels with a query offset where ``exec.nsa_impl``
        resolves to ``pallas`` (:func:`nsa_jax.pallas.chunk.nsa_chunk_pallas`), else
        :func:`nsa_jax.nsa.chunked.nsa_chunk_attention` (jax.numpy)."""
        B, C, _ = x.shape
        q, k_c, v_c, k_s, v_s, k_w, v_w, gates = self.project_raw(x, positions)
        kv, span = cache_update.extend_nsa(cache.kv, cache.start, cache.n, self.ncfg,
                                           self.compress_kv, k_c, v_c, k_s, v_s, k_w, v_w)
        if resolve_nsa_impl(self.xcfg.nsa_impl) == "pallas":
            from nsa_jax.pallas.chunk import nsa_chunk_pallas
            o = nsa_chunk_pallas(q, kv, span, positions, gates, self.ncfg, self.xcfg.kernel)
        else:
            o = nsa_chunk_attention(q, kv, span, positions, gates, self.ncfg)
        out = self.wo(o.reshape(B, C, -1).astype(self.dtype))
        return out, dataclasses.replace(cache, kv=kv)

    def _decode(self, x, cache: kvcache.LayerCache, impl: str):
        B = x.shape[0]
        t = cache.pos
        fused = fused_writes(impl)
        q, rows, gates, rope = self.project_step(x, t, fused is not None)
        kv, q = cache_update.append_nsa(cache.kv, t, self.ncfg, self.compress_block, rows,
                                        q, rope, fused, self._emitter(fused))
        o = nsa_decode(q, kv, t, gates, self.ncfg, impl)
        out = self.wo(o.reshape(B, 1, -1).astype(self.dtype))
        return out, dataclasses.replace(cache, kv=kv)


class DenseAttention(_StepWeights, nnx.Module):
    """Causal GQA attention through ``jax.nn.dot_product_attention`` (cuDNN on GPU, XLA on CPU)."""

    def __init__(self, mcfg: ModelConfig, *, rngs: nnx.Rngs, xcfg: ExecConfig | None = None):
        self.mcfg, self.xcfg = mcfg, xcfg or ExecConfig()
        self.dtype, self.wq, self.wkv = _in_projections(mcfg, 2, rngs)
        self.wo = _out_projection(mcfg, rngs)

    def step_projections(self):
        """The projections the decode step runs as one matrix (``w_step`` = [wq | wkv]
        [dim, (H + 2G) * D], :class:`_StepWeights`)."""
        return self.wq, self.wkv

    def _step_fused(self, x, t, kv: dict, interpret: bool):
        """The Pallas decode path's projections and cache write (x [B,1,dim] at positions t
        [B]), as NSA's: one matmul with ``w_step``, whose output the cache-write kernel reads in
        place (``cache_write.Columns``), rotating the key and q at t itself. -> (caches, q
        [B,H,D] rotated)."""
        from nsa_jax.pallas.cache_write import Columns
        m = self.mcfg
        H, G, D = m.n_heads, m.n_kv_groups, m.head_dim
        P = self._step_matmul(x)
        rope = cos_sin(t, D, m.rope_theta)
        return cache_update.append_dense_rows(kv, t, Columns(P, H * D, (2, G, D)),
                                              Columns(P, 0, (H, D)), rope, interpret)

    def impl(self):
        i = self.xcfg.dense_impl
        if i == "auto":
            return "cudnn" if on_gpu() and self.dtype == jnp.bfloat16 else "xla"
        return i

    def project(self, x, positions):
        B, T, _ = x.shape
        m = self.mcfg
        q = apply_rope(self.wq(x).reshape(B, T, m.n_heads, m.head_dim), positions, m.rope_theta)
        kv = self.wkv(x).reshape(B, T, 2, m.n_kv_groups, m.head_dim)
        k = apply_rope(kv[:, :, 0], positions, m.rope_theta)
        return q, k, kv[:, :, 1]

    def __call__(self, x, positions, cache: kvcache.LayerCache | None = None, segment_ids=None):
        """x [B,S,dim] -> (out, cache); cache modes and ``segment_ids`` as in
        :meth:`NSAAttention.__call__`."""
        B, S, _ = x.shape
        _no_packed_cache(cache, segment_ids)
        if cache is not None and cache.start is not None:    # a chunked prefill's continuation
            q, k, v = self.project(x, positions)
            kv = cache_update.extend_dense(cache.kv, cache.start, cache.n, k, v)
            if resolve_nsa_impl(self.xcfg.nsa_impl) == "pallas":   # as NSA's continuation
                from nsa_jax.pallas.chunk import dense_chunk_pallas
                o = dense_chunk_pallas(q, kv["k"], kv["v"], positions, self.xcfg.kernel)
            else:
                o = dense_chunk_attention(q, kv["k"], kv["v"], positions)
            return self.wo(o.reshape(B, S, -1)), dataclasses.replace(cache, kv=kv)
        if cache is not None and S == 1:
            t = cache.pos
            fused = fused_writes(self.xcfg.decode_impl)
            if fused is not None and hasattr(self, "w_step"):
                kv, q = self._step_fused(x, t, cache.kv, fused)
            else:
                q, k, v = self.project(x, t[:, None])
                kv = cache_update.append_dense(cache.kv, t, k, v, fused)
                q = q[:, 0]
            o = dense_decode(q, kv["k"], kv["v"], t, self.xcfg.decode_impl)
            return self.wo(o.reshape(B, 1, -1)), dataclasses.replace(cache, kv=kv)
        q, k, v = self.project(x, positions)
        impl = self.impl()
        if segment_ids is None:
            o = batch_parallel(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=True, implementation=impl), q, k, v)
        else:
            # not cuDNN's packed layout: it disagreed with the masked path on the H200
            # (tests/test_pallas_gpu.py::test_dense_packed_cudnn_matches_masked_xla)
            pimpl = "pallas" if on_gpu() and self.xcfg.dense_impl != "xla" else "xla"
            o = batch_parallel(lambda q, k, v, seg: dense_packed_attention(q, k, v, seg, pimpl),
                               q, k, v, segment_ids)
        out = self.wo(o.reshape(B, S, -1))
        if cache is None:
            return out, None
        return out, dataclasses.replace(cache, kv=cache_update.fill_dense(cache.kv, k, v))
