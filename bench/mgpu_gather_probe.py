"""Probe, CPU (lowering for CUDA, no GPU): can a Pallas Mosaic GPU kernel gather a block-major work
item's query rows by TMA, one copy per query, into a swizzled [64, 64] tile and store them back?

    python bench/mgpu_gather_probe.py            # prints one line per layout: LOWERED or the error

The block-major selection backward (``pallas/selection_block.py``, Triton) gathers, for one key
block, the h rows (heads of one KV group) of each query that selected it. Hopper's TMA has no
row gather, so a Mosaic GPU version would issue one copy per query. Layouts tried (125M heads:
h = 6, D = 64; 8 queries per 64-row tile):

* ``box8``: q viewed as [B, T*Hq (+8), D] (a free reshape); each query's copy is the 8 rows from
  its group's first head (its 6 heads + 2 rows of the next group, masked), into an 8-row slice of
  the tile (a 1,024-byte swizzle atom); stores go to a padded [B, T*G*8, D] output.
* ``box8p``: as box8, but q laid out by XLA as [B, T*G*8, D], each (query, group)'s 6 rows padded
  with zeros to 8, so each copy starts at row (t*G + g)*8: whole 8-row tiles.
* ``box6``: the query's exact 6 rows into a 6-row slice of the tile.
* ``store6``: 8-row loads as box8 but exact 6-row stores into [B, T, Hq, D].

Two rules come out (bench/NOTES.md, forty-second and forty-third sessions):

* a slice of a (8, 64)-tiled shared-memory ref must be whole 8-row tiles: box6 and store6 fail
  to lower on jax 0.10.2 and 0.11.2;
* so must a tiled copy's *global* start (:func:`row_start`): Mosaic GPU views the global ref as
  tiles too and divides the start by the tile (``TileTransform.transform_index``), so box8's start
  12 t + 6 g copies other rows than asked. jax 0.10.2 lowers box8 anyway; jax 0.11.2's layout
  inference refuses it (an ``AssertionError`` while it builds the error message). box8p lowers
  on both, and is the layout of the branch ``wip/mosaic-block-bwd``'s kernel, which passed its
  GPU parity test on an H200 (forty-third session).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

B, T, Hq, D, G = 1, 512, 12, 64, 2
H = Hq // G
QPT = 8            # queries per 64-row tile, 8 rows each


def row_start(mode: str):
    """The global row where query t's copy for group g starts, in q's layout for ``mode``."""
    if mode == "box8":
        return lambda t, g: t * Hq + g * H
    if mode == "box8p":
        return lambda t, g: (t * G + g) * 8
    raise ValueError(f"row_start: only the 8-row box layouts have one, got {mode!r}")


def _tiles(plgpu):
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def _kernel_body(plgpu, mode, ent_ref, q_ref, k_ref, out_ref, q_smem, k_smem, bar, kbar):
    g = lax.axis_index("g")
    for i in range(QPT):
        t = ent_ref[i]
        if mode in ("box8", "box8p"):
            src, dst = q_ref.at[0, pl.ds(row_start(mode)(t, g), 8)], q_smem.at[pl.ds(8 * i, 8)]
        else:
            src, dst = q_ref.at[0, t, pl.ds(g * H, H)], q_smem.at[pl.ds(8 * i, H)]
        plgpu.copy_gmem_to_smem(src, dst, bar.at[0])
    plgpu.copy_gmem_to_smem(k_ref.at[0, pl.ds(0, 64), g], k_smem, kbar.at[0])
    plgpu.barrier_wait(bar.at[0])
    plgpu.barrier_wait(kbar.at[0])

    def mm(acc):
        plgpu.wgmma(acc, q_smem, k_smem.T)
        return acc[...]

    s = pl.run_scoped(mm, plgpu.ACC((64, 64), jnp.float32))
    q_smem[...] = s.astype(q_smem.dtype)
    plgpu.commit_smem()
    for i in range(QPT):
        t = ent_ref[i]
        if mode in ("box8", "box8p"):
            plgpu.copy_smem_to_gmem(q_smem.at[pl.ds(8 * i, 8)],
                                    out_ref.at[0, pl.ds((t * G + g) * 8, 8)])
        else:
            plgpu.copy_smem_to_gmem(q_smem.at[pl.ds(8 * i, H)], out_ref.at[0, t, pl.ds(g * H, H)])
    plgpu.wait_smem_to_gmem(0)


def lower(mode: str) -> str:
    from jax.experimental.pallas import mosaic_gpu as plgpu
    S = jax.ShapeDtypeStruct

    def run(ent, q, k):
        def kern(ent_ref, q_ref, k_ref, out_ref):
            pl.run_scoped(
                lambda qs, ks, b1, b2: _kernel_body(plgpu, mode, ent_ref, q_ref, k_ref, out_ref,
                                                    qs, ks, b1, b2),
                plgpu.SMEM((64, D), jnp.bfloat16, transforms=_tiles(plgpu)),
                plgpu.SMEM((64, D), jnp.bfloat16, transforms=_tiles(plgpu)),
                plgpu.Barrier(num_arrivals=1, num_barriers=1),
                plgpu.Barrier(num_arrivals=1, num_barriers=1))
        boxed = mode in ("box8", "box8p")
        out = S((B, T * G * 8, D), jnp.bfloat16) if boxed else S((B, T, Hq, D), jnp.bfloat16)
        return plgpu.kernel(kern, out_type=out, grid=(G,), grid_names=("g",))(ent, q, k)

    qs = {"box8": S((B, T * Hq + 8, D), jnp.bfloat16),
          "box8p": S((B, T * G * 8, D), jnp.bfloat16)}.get(mode, S((B, T, Hq, D), jnp.bfloat16))
    return jax.jit(run).trace(S((QPT,), jnp.int32), qs, S((B, T, G, D), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",)).as_text()


def main() -> int:
    for mode in ("box8", "box8p", "box6", "store6"):
        try:
            lower(mode)
            print(f"{mode}: LOWERED")
        except Exception as e:   # the probe's answer is the error itself
            first = (str(e).splitlines() or ["(no message)"])[0]
            print(f"{mode}: {type(e).__name__}: {first[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
