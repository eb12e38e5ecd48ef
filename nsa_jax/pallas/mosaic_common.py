"""What the Mosaic GPU (Hopper) tiled selection kernels share: the device and operand checks
(:func:`operands_unsupported`, :func:`mosaic_unsupported`), the tile constants, the producer
warpgroup's TMA ring (:func:`produce`, :func:`ring_scratch`), the logits with their row bias and
causal / window masks (:func:`logits`), the three-run walk over a tile's listed blocks
(:func:`walk`: masked, unmasked, masked), the 64-row tile lists (:func:`selection_lists`) and the
launch. The kernels that use them: ``mosaic_tiled`` (forward), ``mosaic_tiled_dq``,
``mosaic_tiled_dkv`` and ``mosaic_window``; their schedule is described in ``mosaic_tiled``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.pallas.common import NEG_INF
from nsa_jax.pallas.tiled_index import WORD_BITS, full_counts, tile_lists, words_by_tile

ROWS = 64      # query rows per compute warpgroup (one wgmma M tile) = the tiled kernels' bq
KEYS = 64      # keys per K/V tile = the selection block l'
STAGES = 3     # K/V ring slots
FAR = 1 << 20  # a block id past every query: a step's absent second block (masked as causal)
# "auto" takes each kernel from this head dim (measured faster there on an H100, bench/NOTES.md,
# thirty-first session): the forward and dQ only at 128-wide heads, dK/dV at both 64 and 128
AUTO_MIN_HEAD_DIM = {"sel_tiled_fwd": 128, "sel_tiled_dq": 128, "sel_tiled_dkv": 64}
WIDE_MAX_HEAD_DIM = 64   # the selection forward takes two blocks per step up to this head dim


def plgpu_module():
    from jax.experimental.pallas import mosaic_gpu as plgpu
    return plgpu


def default_device():
    """The device the kernels would run on (jax's first; a seam for the CPU tests)."""
    return jax.devices()[0]


def operands_unsupported(q, k, v, interpret: bool) -> str | None:
    """None where the 64 x 64-tile Mosaic GPU kernels (this module's, ``mosaic_tiled_dkv``,
    ``mosaic_window``) run these operands, else why not: a Hopper GPU, compiled, bf16/fp16,
    equal head dims of 64 or 128, an even number of heads per KV group, T % 64 = 0."""
    Hq, Dk = q.shape[2], q.shape[-1]
    G, Dv = k.shape[2], v.shape[-1]
    if interpret:
        return "it needs a GPU (Mosaic GPU has no interpret mode here)"
    dev = default_device()
    cc = getattr(dev, "compute_capability", None)
    if dev.platform != "gpu" or cc is None or not str(cc).startswith("9"):
        return f"it needs a Hopper GPU (compute capability 9.x), got {dev.device_kind}"
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"it takes bf16/fp16 operands, got {jnp.dtype(q.dtype).name}"
    if Dk != Dv or Dk not in (64, 128):
        return f"it takes equal head dims of 64 or 128, got {Dk}/{Dv}"
    if (Hq // G) % 2:
        return f"it takes groups of an even number of heads, got h = {Hq // G}"
    if q.shape[1] % ROWS:
        return f"it takes T a multiple of {ROWS}, got T = {q.shape[1]}"
    return None


def mosaic_unsupported(q, k, v, cfg: NSAConfig, seg, interpret: bool) -> str | None:
    """None where the tiled selection kernels run these operands (:func:`operands_unsupported`,
    l' = 64, unpacked rows), else why not (for the error of an explicit choice and for "auto"
    to pass over it)."""
    why = operands_unsupported(q, k, v, interpret)
    if why is not None:
        return why
    if cfg.sel_block != KEYS:
        return f"it takes selection blocks of l' = {KEYS} keys, got {cfg.sel_block}"
    if seg is not None:
        return "it takes unpacked rows (packed documents run the Triton kernels)"
    return None


def row_bias(words, rows: int = ROWS):
    """Membership bits [..., nw] (``tiled_index.member_table`` gathered in list order) -> float32
    [..., rows]: 0 where the row selected the pair's block, -inf where not."""
    r = jnp.arange(rows, dtype=jnp.int32)
    w = jnp.take(words, r // WORD_BITS, axis=-1)
    bit = lax.shift_right_logical(w, jnp.broadcast_to(r % WORD_BITS, w.shape)) & 1
    return jnp.where(bit != 0, 0.0, NEG_INF).astype(jnp.float32)


def program(nqt: int, h: int, bcount_ref):
    """(pair, query tile, batch row, warpgroup, KV group, listed blocks) of a CTA on grid
    (Hq / 2, nqt, B): tiles run last to first in launch order (the last tiles list the most
    blocks)."""
    pair = lax.axis_index("pair")
    qt = nqt - 1 - lax.axis_index("tile")
    b = lax.axis_index("batch")
    g = lax.div(pair * 2, jnp.int32(h))
    return pair, qt, b, lax.axis_index("wg"), g, bcount_ref[b, g, qt]


def turns(turn):
    """The two compute warpgroups' turns on the tensor cores: arrive and wait on one barrier of
    two arrivals."""
    plgpu = plgpu_module()

    def take_turn():
        plgpu.barrier_arrive(turn)
        plgpu.barrier_wait(turn)
    return take_turn


def n_steps(count, per: int):
    """Steps of ``per`` listed blocks each over a list of ``count`` blocks."""
    return count if per == 1 else lax.div(count + (per - 1), jnp.int32(per))


def listed(u, i: int, per: int, count):
    """The list position of block ``i`` of step ``u``, clamped into the list (a last step's
    absent block reloads the list's last block; the kernels mask it: :func:`step_blocks`)."""
    return u * per + i if per == 1 else jnp.minimum(u * per + i, count - 1)


def produce(blocks_ref, k_ref, v_ref, bias_ref, b, g, qt, count, ring, *, stages: int,
            per: int = 1):
    """The producer warpgroup: TMA copies of each step's ``per`` listed blocks' K (with the
    pair's row bias; none when ``bias_ref`` is None) and V into ``stages`` ring slots (block i
    of a step at keys [64 i, 64 i + 64) of its slot, each copy on its own barrier), each slot
    refilled once both compute warpgroups freed it."""
    plgpu = plgpu_module()
    plgpu.set_max_registers(40, action="decrease")
    (k_smem, v_smem, b_smem), (k_bar, v_bar, b_bar), (k_free, v_free) = ring
    steps = n_steps(count, per)

    def keys(u, slot):
        for i in range(per):
            li = listed(u, i, per, count)
            blk = pl.ds(blocks_ref[b, g, qt, li] * KEYS, KEYS)
            plgpu.copy_gmem_to_smem(k_ref.at[b, blk, g], k_smem.at[slot, pl.ds(i * KEYS, KEYS)],
                                    k_bar.at[slot * per + i])
            if bias_ref is not None:
                plgpu.copy_gmem_to_smem(bias_ref.at[b, g, qt, li], b_smem.at[slot, i],
                                        b_bar.at[slot * per + i])

    def values(u, slot):
        for i in range(per):
            blk = pl.ds(blocks_ref[b, g, qt, listed(u, i, per, count)] * KEYS, KEYS)
            plgpu.copy_gmem_to_smem(v_ref.at[b, blk, g], v_smem.at[slot, pl.ds(i * KEYS, KEYS)],
                                    v_bar.at[slot * per + i])

    for i in range(stages):
        @pl.when(i < steps)
        def _first():
            keys(i, i)
            values(i, i)

    def refill(u, carry):
        slot = lax.rem(u, jnp.int32(stages))
        plgpu.barrier_wait(k_free.at[slot])
        keys(u, slot)
        plgpu.barrier_wait(v_free.at[slot])
        values(u, slot)
        return carry

    lax.fori_loop(stages, steps, refill, None)


def wait_all(bar, slot, per: int):
    """Wait for the ``per`` copies of one ring slot (one barrier each)."""
    for i in range(per):
        plgpu_module().barrier_wait(bar.at[slot * per + i])


def step_blocks(blocks_ref, b, g, qt, u, per: int, count):
    """The block ids of step ``u``'s ``per`` blocks for the masks; an absent block (past the
    list's end) as :data:`FAR`, which the causal mask hides from every row."""
    ids = []
    for i in range(per):
        j = blocks_ref[b, g, qt, listed(u, i, per, count)]
        ids.append(j if i == 0 else jnp.where(u * per + i < count, j, jnp.int32(FAR)))
    return tuple(ids)


def logits(s, bias, c: float, masked: bool, js, qt, window: int | None = None):
    """Base-2 logits of one step from the raw dot s = Q K^T [64, 64 per] over its ``per``
    blocks (``js``: their ids, :func:`step_blocks`; needed when masked): s * c plus each block's
    row bias (``bias``: a row vector per block, or None), and on a masked step the causal mask
    key <= row, with a ``window`` also key > row - window (the sliding window,
    ``semantics.window_visible``)."""
    plgpu = plgpu_module()
    x = s * c
    per = s.shape[1] // KEYS
    col = second = None
    if per > 1 and (bias is not None or masked):
        col = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
        second = col >= KEYS
    if bias is not None:
        rows_b = [lax.broadcast_in_dim(v, s.shape, [0]) for v in bias]
        x = x + (rows_b[0] if per == 1 else jnp.where(second, rows_b[1], rows_b[0]))
    if masked:
        r = plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA)
        if per == 1:
            col = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
            key = col + js[0] * KEYS
        else:
            key = jnp.where(second, col + (js[1] - 1) * KEYS, col + js[0] * KEYS)
        row = r + qt * ROWS
        vis = key <= row
        if window is not None:
            vis = vis & (key > row - window)
        x = jnp.where(vis, x, NEG_INF)
    return x


def walk(step, carry, nedge, nfull, count, per: int = 1):
    """A tile's listed blocks, ``per`` to a step, in three runs: the steps holding one of the
    first ``nedge`` blocks masked (the window's first block; nedge None: no such run), then the
    steps whose blocks all lie in [nedge, nfull) unmasked (wholly visible to every row), then
    the rest masked (the diagonal, and a last step's absent block)."""
    steps = n_steps(count, per)
    first = 0 if nedge is None else n_steps(nedge, per)
    full = lax.div(nfull, jnp.int32(per)) if per > 1 else nfull
    if nedge is not None:
        carry = lax.fori_loop(0, first, functools.partial(step, masked=True), carry)
        full = jnp.maximum(full, first)
    carry = lax.fori_loop(first, full, functools.partial(step, masked=False), carry)
    return lax.fori_loop(full, steps, functools.partial(step, masked=True), carry)


def edge_count(qt, window: int | None):
    """How many listed blocks of tile ``qt`` open the window (masked by key > row - w): the
    first, when the window starts inside the tile's lists (qt >= w / 64); None without one."""
    if window is None:
        return None
    return (qt >= window // KEYS).astype(jnp.int32)


def rows_vec(ref):
    """A [64] float32 row vector from shared memory in the wgmma rows' layout."""
    plgpu = plgpu_module()
    return plgpu.layout_cast(ref[...], plgpu.Layout.WGMMA.reduce(1))


def slot_bias(b_bar, b_smem, slot, bias_ref, per: int = 1):
    """The step's row biases (one row vector per block) from its ring slot, once loaded (None:
    the kernel takes none)."""
    if bias_ref is None:
        return None
    wait_all(b_bar, slot, per)
    return tuple(rows_vec(b_smem.at[slot, i]) for i in range(per))

def index_lists(idx, T: int, cfg: NSAConfig, seg, lists=None):
    """``tiled_index.tile_lists`` at this module's 64-row tiles: ``lists`` = (bq, its result)
    from a caller that built them already (``selection_tiled.sel_tiled_backward`` for its Triton
    kernels), reused when bq is 64, else built here."""
    if lists is not None and lists[0] == ROWS:
        return lists[1]
    return tile_lists(idx, T, cfg, ROWS, seg)


def row_vectors(lse, delta, gs):
    """The backward kernels' per-row operands as one float32 [B,Hq,3,T] array (lse, delta, gs;
    T minor, so a tile's [3, 64] is one TMA copy). ``gs`` None: ones (the gate already folded
    into lse and delta, ``common.fold_gate``)."""
    gs = jnp.ones_like(lse) if gs is None else gs
    return jnp.stack([lse, delta, gs], axis=-1).astype(jnp.float32).transpose(0, 2, 3, 1)


def selection_lists(idx, T: int, cfg: NSAConfig, seg, lists=None):
    """The 64-row tiles' block lists, full-pair counts and row bias (``tiled_index``)."""
    (blocks, bcount, _, _), table = index_lists(idx, T, cfg, seg, lists)
    nfull = full_counts(blocks, bcount, ROWS, cfg, seg)
    return blocks, bcount, nfull, row_bias(words_by_tile(table, blocks))  # bias [B,G,nqt,Ts,64]


def smem_tiles(plgpu):
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def ring_scratch(plgpu, stages: int, dtype, D: int, Dv: int, per: int = 1):
    """Shared-memory K, V and row-bias ring slots of ``per`` blocks each, their load barriers
    (one per block copy) and their free barriers (two arrivals: both compute warpgroups)."""
    smem = (plgpu.SMEM((stages, per * KEYS, D), dtype, transforms=smem_tiles(plgpu)),
            plgpu.SMEM((stages, per * KEYS, Dv), dtype, transforms=smem_tiles(plgpu)),
            plgpu.SMEM((stages, per, ROWS), jnp.float32))
    return smem, (plgpu.Barrier(num_barriers=stages * per),) * 3, \
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2


def blocks_per_step(D: int, Dv: int) -> int:
    """Listed blocks per step of the selection forward: 2 (128 keys, one 64 x 128 wgmma instead
    of two 64 x 64 ones, half the barriers and scalar loads) at head dims up to
    :data:`WIDE_MAX_HEAD_DIM`, 1 above (128-wide heads fill a 64-key step, and 128-key slots
    would not fit shared memory). Measured on an H100 at the 125M heads, 2k / B=16 (bench/
    NOTES.md, thirty-second session): the forward 0.404 -> 0.362 ms; not taken by the dQ (0.422
    -> 0.417, within the spread, with twice the live logits) nor by the window kernels (slower:
    their <= 9-block lists leave a half-empty last step and more masked work)."""
    return 2 if max(D, Dv) <= WIDE_MAX_HEAD_DIM else 1


def list_operands(lists, q, k, v) -> tuple:
    """The forward / dQ kernels' leading operands: the lists' (blocks, bcount, nfull), q, k, v
    and, when the lists carry one, the row bias (:func:`split_refs` takes their refs apart)."""
    blocks, bcount, nfull, bias = lists
    return (blocks, bcount, nfull, q, k, v) + (() if bias is None else (bias,))


def split_refs(refs, has_bias: bool):
    """-> (the six refs of (blocks, bcount, nfull, q, k, v), the bias ref or None, the rest)."""
    head, rest = refs[:6], refs[6:]
    return head, (rest[0] if has_bias else None), rest[1:] if has_bias else rest


def check_per(per: int) -> None:
    """The kernels take 1 or 2 listed blocks per step (:func:`logits` tells a step's blocks apart
    by column half)."""
    if per not in (1, 2):
        raise ValueError(f"blocks per step must be 1 or 2, got {per}")


def launch(plgpu, body, out_type, Hq: int, nqt: int, B: int):
    return plgpu.kernel(body, out_type=out_type, grid=(Hq // 2, nqt, B),
                        grid_names=("pair", "tile", "batch"), num_threads=3, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(approx_math=True))


def no_interpret(interpret, name):
    if interpret:
        raise ValueError(f"{name}: Mosaic GPU kernels run compiled on a Hopper GPU only (no "
                         f"interpret mode)")


def ring_stages(stages: int, cfg: NSAConfig, T: int) -> int:
    return max(2, min(int(stages), cfg.num_sel_blocks(T)))
