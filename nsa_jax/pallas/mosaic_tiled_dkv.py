"""The tiled selection backward's dK/dV (NSA §3.3.2, Eq. 10-12 differentiated) on Hopper, in
Pallas Mosaic GPU: ``selection_tiled.sel_tiled_bwd_dkv``'s values (its Triton twin), chosen by
``KernelChoices.sel_tiled_dkv``; same operand rules as the forward (``mosaic_tiled.
mosaic_unsupported``).

Schedule: one CTA per (KV group, 64-key block, batch row). The block's K and V are loaded once
and stay in shared memory. Its tile list (``tiled_index.tile_index``: the ascending 64-row query
tiles some row of which selected the block) times the group's h heads are the steps; the two
compute warpgroups take the heads of parity 0 and 1 and walk the tiles together, and a producer
warpgroup TMA-loads each step's q, dO and row vectors (lse, delta, gs) for the two heads, plus
the tile's row bias (the rows' membership, in block order), into 2 ring slots. Logits are formed
keys-first (s^T = K Q^T) so that P^T and dS^T are the register A operands of the dV and dK
wgmmas; the diagonal pair (the block's own tile) adds the causal mask. At the end warpgroup 1
hands its float32 dK, then dV, to warpgroup 0 through shared memory, which stores the sums in the
input dtype (the op rounds them there anyway).

Measured on an H100 (bench/NOTES.md, thirty-first session): -32% against the Triton kernel at
the 125M heads (64 wide), -26 to -29% at the bench heads (128 wide). GPU parity tests in
``tests/test_mosaic_tiled.py``; on the CPU the kernel is lowered for CUDA, not run.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import LOG2E, NEG_INF
from nsa_jax.pallas.mosaic_common import (KEYS, ROWS, index_lists, no_interpret, plgpu_module,
                                          row_bias, row_vectors, smem_tiles)
from nsa_jax.pallas.tiled_index import diagonal_counts, words_by_block


def _dkv_kernel(tiles_ref, tcount_ref, ndiag_ref, nlate_ref, q_ref, k_ref, v_ref, bias_ref,
                do_ref, rv_ref, dk_ref, dv_ref, scoped, *, h: int, stages: int, c: float,
                scale: float, dtype, window: int | None = None, gated: bool = True):
    """dK, dV of one key block (64 keys of one group) over the (query tile, head) pairs of its
    tile list: warpgroup w takes the heads of parity w, both walk the tiles together (one ring
    slot holds a tile's q, dO and row vectors for the two heads of a step), and the two partial
    sums meet in shared memory at the end. Keys-first: s^T = K Q^T, P^T = exp2(s^T c + bias -
    lse), dV += (P^T gs) dO, dP^T = V dO^T, dS^T = P^T (dP^T gs - delta), dK += dS^T Q (gs: the
    rows' output scale, the branch gate). ``bias_ref`` None: no row bias; ``window``: the
    block's tile list is its window's (the block's own tile, the tiles that see all of it, and
    last the tile where the window opens, masked by key > row - window). ``gated`` False: the
    gate is folded into lse and delta (``common.fold_gate``), no multiply by gs."""
    plgpu = plgpu_module()
    wgmma_cols = plgpu.Layout.WGMMA.reduce(0)
    (k_smem, v_smem, q_smem, do_smem, rv_smem, b_smem, red_smem), loaded, free, sync = scoped
    kv_bar, q_bar, do_bar, rv_bar, b_bar = loaded
    g, j, b = lax.axis_index("group"), lax.axis_index("block"), lax.axis_index("batch")
    wg = lax.axis_index("wg")
    hh = h // 2
    count = tcount_ref[b, g, j] * hh          # steps: (tile, head pair)
    ndiag = ndiag_ref[b, g, j] * hh
    D, Dv = k_ref.shape[-1], v_ref.shape[-1]

    def cols(ref):
        return plgpu.layout_cast(ref[...], wgmma_cols)

    def bcast(x):
        return lax.broadcast_in_dim(x, (KEYS, ROWS), [1])

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        blk = pl.ds(j * KEYS, KEYS)

        @pl.when(wg == 0)
        def _load_block():   # one copy for both warpgroups
            plgpu.copy_gmem_to_smem(k_ref.at[b, blk, g], k_smem, kv_bar.at[0])
            plgpu.copy_gmem_to_smem(v_ref.at[b, blk, g], v_smem, kv_bar.at[1])
        plgpu.barrier_wait(kv_bar.at[0])
        plgpu.barrier_wait(kv_bar.at[1])
        dk = plgpu.layout_cast(jnp.zeros((KEYS, D), jnp.float32), plgpu.Layout.WGMMA)
        dv = plgpu.layout_cast(jnp.zeros((KEYS, Dv), jnp.float32), plgpu.Layout.WGMMA)

        def step(it, carry, masked: bool):
            dk, dv = carry
            slot = lax.rem(it, jnp.int32(stages))
            mine = slot * 2 + wg
            qs, dos = q_smem.at[slot, wg], do_smem.at[slot, wg]
            plgpu.barrier_wait(q_bar.at[mine])

            def scores(acc_ref):
                plgpu.wgmma(acc_ref, k_smem, qs.T)
                return acc_ref[...]

            st = pl.run_scoped(scores, plgpu.ACC((KEYS, ROWS), jnp.float32))
            x = st * c
            if bias_ref is not None:
                plgpu.barrier_wait(b_bar.at[slot])
                x = x + bcast(cols(b_smem.at[slot]))
            plgpu.barrier_wait(rv_bar.at[mine])
            if masked:   # keys-first: rows are keys, columns the tile's queries
                r = plgpu.broadcasted_iota(jnp.int32, st.shape, 0, layout=plgpu.Layout.WGMMA)
                col = plgpu.broadcasted_iota(jnp.int32, st.shape, 1, layout=plgpu.Layout.WGMMA)
                key = r + j * KEYS
                row = col + tiles_ref[b, g, j, lax.div(it, jnp.int32(hh))] * ROWS
                vis = key <= row
                if window is not None:
                    vis = vis & (key > row - window)
                x = jnp.where(vis, x, NEG_INF)
            pt = jnp.exp2(x - bcast(cols(rv_smem.at[slot, wg, 0])))
            plgpu.barrier_wait(do_bar.at[mine])

            gs = bcast(cols(rv_smem.at[slot, wg, 2])) if gated else None   # the gate
            ptg = (pt if gs is None else pt * gs).astype(dtype)

            def dv_dpt(refs):
                dv_ref, dpt_ref = refs
                plgpu.wgmma(dv_ref, ptg, dos)               # dV += P^T (gs dO)
                plgpu.wgmma(dpt_ref, v_smem, dos.T)

            zeros = plgpu.layout_cast(jnp.zeros((KEYS, ROWS), jnp.float32), plgpu.Layout.WGMMA)
            dv, dpt = pl.run_state(dv_dpt)((plgpu.ACC.init(dv), plgpu.ACC.init(zeros)))
            dpg = dpt if gs is None else dpt * gs
            dst = pt * (dpg - bcast(cols(rv_smem.at[slot, wg, 1])))

            def dk_step(acc_ref):
                plgpu.wgmma(acc_ref, dst.astype(dtype), qs)

            dk = pl.run_state(dk_step)(plgpu.ACC.init(dk))
            plgpu.barrier_arrive(free.at[slot])      # this warpgroup is done with the slot
            return dk, dv

        # the block's own tile first (causal), then the tiles that see all of it, then (window)
        # the tile where the window opens
        nlate = count if window is None else nlate_ref[b, g, j] * hh
        carry = lax.fori_loop(0, ndiag, functools.partial(step, masked=True), (dk, dv))
        carry = lax.fori_loop(ndiag, nlate, functools.partial(step, masked=False), carry)
        if window is not None:
            carry = lax.fori_loop(nlate, count, functools.partial(step, masked=True), carry)
        dk, dv = carry

        def meet():
            plgpu.barrier_arrive(sync)
            plgpu.barrier_wait(sync)

        # the two warpgroups' partial sums: warpgroup 1 hands its dK, then its dV, to 0
        for part, (acc, out_smem, s) in enumerate(((dk, k_smem, scale), (dv, v_smem, 1.0))):
            @pl.when(wg == 1)
            def _hand():
                red_smem[...] = acc
            meet()

            @pl.when(wg == 0)
            def _sum():
                total = acc + plgpu.layout_cast(red_smem[...], plgpu.Layout.WGMMA)
                out_smem[...] = (total * s).astype(dtype)
            meet()

        @pl.when(wg == 0)
        def _store():
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, blk, g])
            plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, blk, g])
            plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _producer():
        plgpu.set_max_registers(40, action="decrease")

        def issue(it, slot):
            u = lax.div(it, jnp.int32(hh))
            pair = it - u * hh
            rows = pl.ds(tiles_ref[b, g, j, u] * ROWS, ROWS)
            if bias_ref is not None:
                plgpu.copy_gmem_to_smem(bias_ref.at[b, g, j, u], b_smem.at[slot],
                                        b_bar.at[slot])
            for w in range(2):
                hd = g * h + pair * 2 + w
                mine = slot * 2 + w
                plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hd], q_smem.at[slot, w],
                                        q_bar.at[mine])
                plgpu.copy_gmem_to_smem(rv_ref.at[b, hd, :, rows], rv_smem.at[slot, w],
                                        rv_bar.at[mine])
                plgpu.copy_gmem_to_smem(do_ref.at[b, rows, hd], do_smem.at[slot, w],
                                        do_bar.at[mine])

        for i in range(stages):
            @pl.when(i < count)
            def _first():
                issue(i, i)

        def refill(it, carry):
            slot = lax.rem(it, jnp.int32(stages))
            plgpu.barrier_wait(free.at[slot])
            issue(it, slot)
            return carry

        lax.fori_loop(stages, count, refill, None)


def dkv_call(q, k, v, do, rv, lists, scale: float, *, stages: int, name: str,
             window: int | None = None, gated: bool = True):
    """Launch the dK/dV kernel on the blocks' 64-row tile ``lists`` = (tiles, tcount, ndiag,
    nlate or None, bias or None; ``tiled_index``'s layout, nlate: where a window's last masked
    run starts) with the rows' [B,Hq,3,T] vectors ``rv`` -> dK, dV in k's / v's dtype
    (``gated`` False: rv's gate row is not read, the gate being folded into lse and delta)."""
    plgpu = plgpu_module()
    B, T, Hq, D = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    tiles, tcount, ndiag, nlate, bias = lists
    Ts = tcount.shape[-1]
    operands = (tiles, tcount, ndiag) + (() if nlate is None else (nlate,)) + (q, k, v) + \
        (() if bias is None else (bias,)) + (do.astype(q.dtype), rv)

    def body(*refs):
        refs = list(refs)
        tiles_ref, tcount_ref, ndiag_ref = refs[:3]
        del refs[:3]
        nlate_ref = refs.pop(0) if nlate is not None else None
        q_ref, k_ref, v_ref = refs[:3]
        del refs[:3]
        bias_ref = refs.pop(0) if bias is not None else None
        do_ref, rv_ref, dk_ref, dv_ref = refs
        t = smem_tiles(plgpu)
        scratch = (plgpu.SMEM((KEYS, D), k.dtype, transforms=t),
                   plgpu.SMEM((KEYS, Dv), v.dtype, transforms=t),
                   plgpu.SMEM((stages, 2, ROWS, D), q.dtype, transforms=t),
                   plgpu.SMEM((stages, 2, ROWS, Dv), q.dtype, transforms=t),
                   plgpu.SMEM((stages, 2, 3, ROWS), jnp.float32),
                   plgpu.SMEM((stages, ROWS), jnp.float32),
                   plgpu.SMEM((KEYS, D), jnp.float32,   # the partial sums' handover (D = Dv)
                              transforms=(plgpu.TilingTransform((8, 32)),
                                          plgpu.SwizzleTransform(128))))
        loaded = (plgpu.Barrier(num_barriers=2),) + (plgpu.Barrier(num_barriers=2 * stages),) * 3 \
            + (plgpu.Barrier(num_barriers=stages),)
        pl.run_scoped(
            lambda *s: _dkv_kernel(tiles_ref, tcount_ref, ndiag_ref, nlate_ref, q_ref, k_ref,
                                   v_ref, bias_ref, do_ref, rv_ref, dk_ref, dv_ref, s, h=Hq // G,
                                   stages=stages, c=float(scale * LOG2E), scale=float(scale),
                                   dtype=q.dtype, window=window, gated=gated),
            scratch, loaded, plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    body.__name__ = name
    return plgpu.kernel(
        body,
        out_type=[jax.ShapeDtypeStruct((B, T, G, D), k.dtype),
                  jax.ShapeDtypeStruct((B, T, G, Dv), v.dtype)],
        grid=(G, Ts, B), grid_names=("group", "block", "batch"), num_threads=3,
        thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True))(*operands)


def sel_tiled_bwd_dkv_mosaic(q, k, v, idx, do, gs, lse, delta, cfg: NSAConfig, scale: float,
                             interpret: bool, *, seg=None, lists=None, stages: int = 2):
    """dK, dV in k's / v's dtype [B,T,G,D] of the selection branch
    (``selection_tiled.sel_tiled_bwd_dkv``'s values, rounded once) for the cotangent ``gs * do``,
    from the forward's base-2 ``lse`` and ``delta = gs * rowsum(o * do)`` (``gs`` None: lse and
    delta with the gate folded in, ``common.fold_gate``); one CTA per (group,
    key block, batch row) over the block's 64-row tile list (``tiled_index.tile_index``;
    ``lists`` as ``mosaic_common.index_lists`` takes them)."""
    no_interpret(interpret, "sel_tiled_bwd_dkv_mosaic")
    T = q.shape[1]
    (_, _, tiles, tcount), table = index_lists(idx, T, cfg, seg, lists)
    ndiag = diagonal_counts(tiles, tcount, ROWS, cfg, seg)
    bias = row_bias(words_by_block(table, tiles))            # [B,G,Ts,nqt,ROWS]
    return dkv_call(q, k, v, do, row_vectors(lse, delta, gs), (tiles, tcount, ndiag, None, bias),
                    scale, stages=stages, name="nsa_sel_tiled_bwd_dkv_mgpu",
                    gated=gs is not None)
