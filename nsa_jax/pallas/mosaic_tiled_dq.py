"""The tiled selection backward's dQ (NSA §3.3.2, Eq. 10-12 differentiated) on Hopper, in Pallas
Mosaic GPU: ``selection_tiled.sel_tiled_bwd_dq``'s values (its Triton twin), chosen by
``KernelChoices.sel_tiled_dq``; same operand rules and schedule as the forward
(``mosaic_tiled``: one CTA per (pair of heads of one KV group, 64-row query tile, batch row), two
compute warpgroups taking turns on the tensor cores, a producer warpgroup TMA-loading each listed
block's K / V and row bias into a ring).

Per listed block: s = Q K^T and dP = dO V^T (two wgmmas), P = exp2(logits - lse) from the saved
base-2 lse, dS = P (dP gs - delta), dQ += dS K (wgmma, dS from registers); q, dO and the rows'
[3, 64] vectors (lse, delta, gs) TMA-loaded once per warpgroup, dQ leaving in float32 through
shared memory. The window branch (``mosaic_window``) runs the same kernel on its fixed lists.

Measured on an H100 (bench/NOTES.md, thirty-first session): -19 to -20% against the Triton dQ at
the bench heads (128 wide), +6% at the 125M heads (64 wide); hence
``mosaic_common.AUTO_MIN_HEAD_DIM``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import LOG2E, cdiv
from nsa_jax.pallas.mosaic_common import (KEYS, ROWS, STAGES, check_per, edge_count, launch,
                                          list_operands, logits, no_interpret, plgpu_module,
                                          produce, program, ring_scratch, ring_stages,
                                          row_vectors, rows_vec, selection_lists, slot_bias,
                                          smem_tiles, split_refs, step_blocks, turns, wait_all,
                                          walk)


def _dq_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref, bias_ref, do_ref, rv_ref,
               dq_ref, scoped, *, h: int, stages: int, c: float, scale: float, nqt: int, dtype,
               window: int | None = None, per: int = 1):
    """dQ of one tile for two heads: per listed block, s = Q K^T and dP = dO V^T (wgmma), P =
    exp2(logits - lse), dS = P * (dP * gs - delta), dQ += dS K (wgmma, dS from registers)."""
    plgpu = plgpu_module()
    (q_smem, do_smem, k_smem, v_smem, b_smem, rv_smem, dq_smem), loaded, freed, turn = scoped
    q_bar, do_bar, rv_bar, k_bar, v_bar, b_bar = loaded
    k_free, v_free = freed
    pair, qt, b, wg, g, count = program(nqt, h, bcount_ref)
    take_turn = turns(turn)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        hd = pair * 2 + wg
        qs, dos = q_smem.at[wg], do_smem.at[wg]
        rows = pl.ds(qt * ROWS, ROWS)
        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hd], qs, q_bar.at[wg])
        plgpu.copy_gmem_to_smem(do_ref.at[b, rows, hd], dos, do_bar.at[wg])
        plgpu.copy_gmem_to_smem(rv_ref.at[b, hd, :, rows], rv_smem.at[wg], rv_bar.at[wg])
        for bar in (q_bar, do_bar, rv_bar):
            plgpu.barrier_wait(bar.at[wg])
        lse = rows_vec(rv_smem.at[wg, 0])
        delta = rows_vec(rv_smem.at[wg, 1])
        gs = rows_vec(rv_smem.at[wg, 2])
        dq = plgpu.layout_cast(jnp.zeros((ROWS, q_ref.shape[-1]), jnp.float32),
                               plgpu.Layout.WGMMA)
        pl.when(wg == 1)(take_turn)

        def step(u, dq, masked: bool):
            slot = lax.rem(u, jnp.int32(stages))
            wait_all(k_bar, slot, per)
            wait_all(v_bar, slot, per)

            def scores(s_ref, dp_ref):
                plgpu.wgmma(s_ref, qs, k_smem.at[slot].T)
                plgpu.wgmma(dp_ref, dos, v_smem.at[slot].T)
                take_turn()
                return s_ref[...], dp_ref[...]

            s, dp = pl.run_scoped(scores, plgpu.ACC((ROWS, per * KEYS), jnp.float32),
                                  plgpu.ACC((ROWS, per * KEYS), jnp.float32))
            plgpu.barrier_arrive(v_free.at[slot])
            bias = slot_bias(b_bar, b_smem, slot, bias_ref, per)
            js = step_blocks(blocks_ref, b, g, qt, u, per, count) if masked else None
            x = logits(s, bias, c, masked, js, qt, window)
            p = jnp.exp2(x - lax.broadcast_in_dim(lse, x.shape, [0]))
            ds = p * (dp * lax.broadcast_in_dim(gs, dp.shape, [0])
                      - lax.broadcast_in_dim(delta, dp.shape, [0]))
            ds16 = ds.astype(dtype)
            dq, ds16 = lax.optimization_barrier((dq, ds16))
            plgpu.barrier_arrive(turn)
            plgpu.barrier_wait(turn)

            def dsk(acc_ref):
                plgpu.wgmma(acc_ref, ds16, k_smem.at[slot])

            dq = pl.run_state(dsk)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(k_free.at[slot])      # K and the bias slot are read
            return dq

        dq = walk(step, dq, edge_count(qt, window), nfull_ref[b, g, qt], count, per)
        pl.when(wg == 0)(take_turn)
        dq_smem.at[wg][...] = dq * scale
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dq_smem.at[wg], dq_ref.at[b, rows, hd])
        plgpu.wait_smem_to_gmem(0)

    pl.when(wg == 2)(functools.partial(
        produce, blocks_ref, k_ref, v_ref, bias_ref, b, g, qt, count,
        ((k_smem, v_smem, b_smem), (k_bar, v_bar, b_bar), (k_free, v_free)), stages=stages,
        per=per))


def dq_call(q, k, v, do, rv, lists, scale: float, *, stages: int, name: str,
            window: int | None = None, per: int = 1):
    """Launch the dQ kernel on 64-row tile ``lists`` (as ``mosaic_tiled.forward_call``, with
    ``per`` listed blocks per step: 1 everywhere today, ``mosaic_common.blocks_per_step`` says
    why) with the rows' [B,Hq,3,T] vectors ``rv`` (``mosaic_common.row_vectors``) -> dQ float32
    [B,T,Hq,Dk]."""
    check_per(per)
    plgpu = plgpu_module()
    B, T, Hq, D = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    nqt = cdiv(T, ROWS)
    has_bias = lists[3] is not None

    def body(*refs):
        head, bias_ref, (do_ref, rv_ref, dq_ref) = split_refs(refs, has_bias)
        blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref = head
        ring, loaded, freed = ring_scratch(plgpu, stages, q.dtype, D, Dv, per)
        scratch = (plgpu.SMEM((2, ROWS, D), q.dtype, transforms=smem_tiles(plgpu)),
                   plgpu.SMEM((2, ROWS, Dv), q.dtype, transforms=smem_tiles(plgpu))) + ring + \
            (plgpu.SMEM((2, 3, ROWS), jnp.float32),
             plgpu.SMEM((2, ROWS, D), jnp.float32))
        pl.run_scoped(
            lambda *s: _dq_kernel(blocks_ref, bcount_ref, nfull_ref, q_ref, k_ref, v_ref,
                                  bias_ref, do_ref, rv_ref, dq_ref, s, h=Hq // G, stages=stages,
                                  c=float(scale * LOG2E), scale=float(scale), nqt=nqt,
                                  dtype=q.dtype, window=window, per=per),
            scratch, (plgpu.Barrier(num_barriers=2),) * 3 + loaded, freed,
            plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    body.__name__ = name
    return launch(plgpu, body, jax.ShapeDtypeStruct((B, T, Hq, D), jnp.float32), Hq, nqt,
                  B)(*list_operands(lists, q, k, v), do.astype(q.dtype), rv)


def dq_stages(stages: int, D: int, Dv: int) -> int:
    """The dQ kernel's ring slots: at 128-wide heads q, dO, the float32 dQ staging and 3 K/V
    slots would pass the 227 KB of shared memory by ~200 bytes, so 2 there."""
    return min(stages, 2) if max(D, Dv) >= 128 else stages


def sel_tiled_bwd_dq_mosaic(q, k, v, idx, do, gs, lse, delta, cfg: NSAConfig, scale: float,
                            interpret: bool, *, seg=None, lists=None, stages: int = STAGES):
    """dQ float32 [B,T,Hq,Dk] of the selection branch (``selection_tiled.sel_tiled_bwd_dq``'s
    values; 64-row lists from ``idx``, or ``lists`` as :func:`index_lists` takes them) for the
    cotangent ``gs * do``, from the forward's base-2 ``lse`` and ``delta = gs * rowsum(o * do)``
    (float32 [B,T,Hq] each)."""
    no_interpret(interpret, "sel_tiled_bwd_dq_mosaic")
    T = q.shape[1]
    stages = ring_stages(dq_stages(stages, q.shape[-1], v.shape[-1]), cfg, T)
    return dq_call(q, k, v, do, row_vectors(lse, delta, gs),
                   selection_lists(idx, T, cfg, seg, lists), scale, stages=stages,
                   name="nsa_sel_tiled_bwd_dq_mgpu")
