"""Selected-block attention forward (NSA §3.3.2, Eq. 10-12 applied) on Hopper, in Pallas Mosaic
GPU: the tiled selection forward (``selection_tiled.sel_tiled_forward``, its Triton twin, same
contract) with wgmma, TMA and a producer warpgroup.

Why a second backend: jax deprecated the Pallas Triton backend in 0.11.0, and on an H100 jax's
own Mosaic GPU flash attention runs the causal forward 1.3-1.9x faster than our Triton kernel of
the same algorithm (bench/NOTES.md, thirtieth session). This kernel is the first of ours on it;
``KernelChoices.sel_tiled_fwd`` picks it, and the Triton kernels stay for every other GPU and for
the shapes this one does not take (:func:`mosaic_unsupported`). The backward's kernels follow:
``mosaic_tiled_dq.sel_tiled_bwd_dq_mosaic`` (dQ on the forward's schedule; ``sel_tiled_dq``) and
``mosaic_tiled_dkv.sel_tiled_bwd_dkv_mosaic`` (one CTA per key block; ``sel_tiled_dkv``); both
use the shared pieces in ``mosaic_common`` (the producer, the logits and masks, the three-run ``walk``, the
ring and the lists). ``mosaic_window`` runs all three on the sliding window's fixed lists.

Schedule: one CTA per (pair of query heads of one KV group, query tile of 64 rows, batch row),
three warpgroups:

* two compute warpgroups, one head each, 64 query rows each (one wgmma M tile). Both heads
  belong to one KV group, so they walk the *same* block list (``tiled_index.tile_index``: the
  ascending blocks some row of the tile selected) and share every K/V tile: one load per tile
  for two heads;
* one producer warpgroup issues the TMA copies of each listed block's K and V (l' = 64 keys, one
  tile) and of the pair's row bias into ``stages`` ring slots, refilling a slot once both
  compute warpgroups have released it.

Per listed block j: s = Q K_j^T (wgmma into registers), x = s * scale * log2(e) + bias_r (the
row bias, 0 where row r selected j and -inf where not: ``tiled_index.member_table``'s bits as a
float row built in XLA), the causal mask key <= row only on the diagonal pair (j equal to the
tile: with 64-row tiles and 64-key blocks every other listed block lies wholly before the tile's
first query; with a window also key > row - w on the window's first pair), then the online
softmax (FlashAttention-2; a row that has seen no key keeps m = -inf and gets p = 0) and
acc += P V_j (wgmma, P from registers). The two compute warpgroups
take turns on the tensor cores through a shared barrier (one runs its softmax while the other's
wgmma runs), as jax's ``attention_mgpu`` does.

Output: o in the input dtype [B,T,Hq,Dv] (the op keeps the selection output in q's dtype for
the backward anyway: ``nsa.py``) and the base-2 lse [B,T,Hq] (+inf for a row with no visible
key), which the Triton dQ and dK/dV kernels consume unchanged.

Measured on an H100 (bench/NOTES.md, thirty-first session), against the Triton kernels: at the
bench heads (64 / 4 / 128) forward -29 to -30%, dQ -19 to -20%; at the 125M heads (64 wide)
forward +13 to +16% and dQ +6%, where the Triton forward already runs at ~300 TFLOP/s and each
step's two 64 x 64 x 64 wgmmas leave the per-step barriers and loads a large share. With two
listed blocks per step there (:func:`blocks_per_step`, thirty-second session) the forward is
+2.5%. Hence ``AUTO_MIN_HEAD_DIM``.

No interpret mode: Mosaic GPU kernels run only on a Hopper GPU, so their parity tests are
``@pytest.mark.gpu``; on the CPU the tests lower the kernels for CUDA (catching every tracing,
layout and shared-memory error) without running them. jax's Mosaic GPU interpreter (under
``jax._src``) was tried and cannot run them (no register-operand wgmma, no ``run_state``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import LOG2E, NEG_INF, POS_INF, cdiv
from nsa_jax.pallas.mosaic_common import (KEYS, ROWS, STAGES, blocks_per_step, check_per,
                                          edge_count, launch, list_operands, logits, no_interpret,
                                          plgpu_module, produce, program, ring_scratch,
                                          ring_stages, selection_lists, slot_bias, smem_tiles,
                                          split_refs, step_blocks, turns, wait_all, walk)



# ---- forward -----------------------------------------------------------------------------------
def _fwd_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref, bias_ref, o_ref, lse_ref,
                scoped, *, h: int, dv: int, stages: int, c: float, nqt: int, dtype,
                window: int | None = None, per: int = 1):
    plgpu = plgpu_module()
    (q_smem, k_smem, v_smem, b_smem, lse_smem), loaded, freed, turn = scoped
    q_bar, k_bar, v_bar, b_bar = loaded
    k_free, v_free = freed
    pair, qt, b, wg, g, count = program(nqt, h, bcount_ref)
    take_turn = turns(turn)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        hd = pair * 2 + wg
        qs = q_smem.at[wg]
        rows = pl.ds(qt * ROWS, ROWS)
        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hd], qs, q_bar.at[wg])
        plgpu.barrier_wait(q_bar.at[wg])
        m = plgpu.layout_cast(jnp.full((ROWS,), NEG_INF, jnp.float32),
                              plgpu.Layout.WGMMA.reduce(1))
        lsum = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        acc = plgpu.layout_cast(jnp.zeros((ROWS, dv), jnp.float32), plgpu.Layout.WGMMA)
        pl.when(wg == 1)(take_turn)

        def step(u, carry, masked: bool):
            acc, m, lsum = carry
            slot = lax.rem(u, jnp.int32(stages))
            wait_all(k_bar, slot, per)

            def qk(acc_ref):
                plgpu.wgmma(acc_ref, qs, k_smem.at[slot].T)
                take_turn()
                return acc_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((ROWS, per * KEYS), jnp.float32))
            bias = slot_bias(b_bar, b_smem, slot, bias_ref, per)
            plgpu.barrier_arrive(k_free.at[slot])     # K and the bias slot are read
            js = step_blocks(blocks_ref, b, g, qt, u, per, count) if masked else None
            x = logits(s, bias, c, masked, js, qt, window)
            m_new = jnp.maximum(m, x.max(axis=1))
            m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
            alpha = jnp.exp2(m - m_safe)
            p = jnp.exp2(x - lax.broadcast_in_dim(m_safe, x.shape, [0]))
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            lsum = lsum * alpha + p.sum(axis=1)
            p16 = p.astype(dtype)
            acc, lsum, m_new, p16 = lax.optimization_barrier((acc, lsum, m_new, p16))
            plgpu.barrier_arrive(turn)                # softmax done
            wait_all(v_bar, slot, per)
            plgpu.barrier_wait(turn)                  # the tensor cores are ours

            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, lsum

        acc, m, lsum = walk(step, (acc, m, lsum), edge_count(qt, window), nfull_ref[b, g, qt],
                            count, per)
        pl.when(wg == 0)(take_turn)

        has = lsum > 0.0
        l_safe = jnp.where(has, lsum, 1.0)
        acc = acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])
        qs[...] = acc.astype(dtype)
        lse_smem.at[wg][...] = jnp.where(has, m + jnp.log(l_safe) * LOG2E, POS_INF)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(qs, o_ref.at[b, rows, hd])
        plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[b, hd, rows])
        plgpu.wait_smem_to_gmem(0)

    pl.when(wg == 2)(functools.partial(
        produce, blocks_ref, k_ref, v_ref, bias_ref, b, g, qt, count,
        ((k_smem, v_smem, b_smem), (k_bar, v_bar, b_bar), (k_free, v_free)), stages=stages,
        per=per))

def forward_call(q, k, v, lists, scale: float, *, stages: int, name: str,
                 window: int | None = None, per: int = 1):
    """Launch the forward kernel on 64-row tile ``lists`` = (blocks, bcount, nfull, bias or None;
    ``tiled_index``'s layout) -> o in q's dtype [B,T,Hq,Dv], base-2 lse float32 [B,T,Hq].
    ``window``: the pairs' masks also keep key > row - window (``walk``); ``name``: the
    kernel's name in profiles; ``per``: listed blocks per step (1 or 2, :func:`blocks_per_step`)."""
    check_per(per)
    plgpu = plgpu_module()
    B, T, Hq, D = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    nqt = cdiv(T, ROWS)
    has_bias = lists[3] is not None

    def body(*refs):
        head, bias_ref, (o_ref, lse_ref) = split_refs(refs, has_bias)
        blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref = head
        ring, loaded, freed = ring_scratch(plgpu, stages, q.dtype, D, Dv, per)
        scratch = (plgpu.SMEM((2, ROWS, D), q.dtype, transforms=smem_tiles(plgpu)),) + ring + \
            (plgpu.SMEM((2, ROWS), jnp.float32),)
        pl.run_scoped(
            lambda *s: _fwd_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref,
                                   bias_ref, o_ref, lse_ref, s, h=Hq // G, dv=Dv, stages=stages,
                                   c=float(scale * LOG2E), nqt=nqt, dtype=q.dtype,
                                   window=window, per=per),
            scratch, (plgpu.Barrier(num_barriers=2),) + loaded, freed,
            plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    body.__name__ = name
    o, lse_t = launch(plgpu, body,
                       [jax.ShapeDtypeStruct((B, T, Hq, Dv), q.dtype),
                        jax.ShapeDtypeStruct((B, Hq, T), jnp.float32)], Hq, nqt, B)(
        *list_operands(lists, q, k, v))
    return o, jnp.swapaxes(lse_t, 1, 2)


def sel_tiled_forward_mosaic(q, k, v, idx, cfg: NSAConfig, bs, scale: float, interpret: bool,
                             *, choices=None, seg=None, stages: int = STAGES):
    """Same contract as ``selection_tiled.sel_tiled_forward`` except that o comes in q's dtype:
    -> o [B,T,Hq,Dv], lse2 float32 [B,T,Hq]. Operands must pass :func:`mosaic_unsupported`
    (checked by the caller, ``nsa.tiled_backend``); ``bs`` and ``choices`` are accepted
    for the shared signature (the tiles are fixed: 64 rows, 64 keys)."""
    del bs, choices
    no_interpret(interpret, "sel_tiled_forward_mosaic")
    return forward_call(q, k, v, selection_lists(idx, q.shape[1], cfg, seg), scale,
                        stages=ring_stages(stages, cfg, q.shape[1]), name="nsa_sel_tiled_fwd_mgpu",
                        per=blocks_per_step(q.shape[-1], v.shape[-1]))
