"""Selected-block attention (NSA §3.3.2, Eq. 10-12 applied): the backward and its custom VJP.

Forward and dQ: the query-major kernels of ``selection_query`` (one program per (query, KV
group) loads that query's n selected blocks).
``sel_forward`` is re-exported here. dK/dV need the transpose: every key block receives gradient
from the queries that selected it. Two ways are implemented (``KernelChoices.sel_bwd``):

* ``"atomic"``: the dQ program also forms each selected block's dK/dV tile and atomically adds
  it to a float32 accumulator: n * l' * (Dk + Dv) atomic adds per (t, g).
* ``"inverted"`` (default): a block -> query index is built with one sort of the
  (block, query) pairs; each work item is one key block and up to ``sel_chunk`` of its queries,
  gathered ``rows // h`` queries x h heads per tile, so dK/dV accumulate in registers with
  full-height tensor-core tiles and only one atomic tile add per work item reaches memory
  (a block can have up to T queries — forced initial blocks do — so blocks are split into
  chunks to keep programs balanced, and the chunks of one block meet in the atomic add).
  dQ then comes from ``selection_query.sel_dq`` (recompute p from the saved lse,
  dS = P * (dO V^T - delta), dQ = dS K); with ``KernelChoices.sel_dq = "block"`` it is formed
  instead inside the inverted dK/dV kernel (``selection_block.sel_backward_block``); with
  ``"ds"`` (opt-in) the dK/dV kernel also stores each tile's dS, rounded to the input dtype, in
  the index's entry order (entry p of a (b, g) row at rows p*h .. p*h + h - 1 of a [B*G,
  T*n*h + rows, L] buffer: a tile's entries are consecutive, so its dS is one contiguous store),
  and ``selection_query.sel_dq_from_ds`` sums dS K over each query's slots, finding a (query,
  slot)'s rows through the inverse of the index's sort (``entry_positions``).

The gate: every backward here takes the branch gate folded into the saved lse
(``common.fold_gate``: gs P = exp2(s c - lse + log2 gs)), so no kernel multiplies by gs or loads
it (on an H200 the block-major backward went -5.4% at 125M 8k / B=4 and the per-query dQ -7.3%
at the bench shape; bench/NOTES.md, thirty-ninth session).

Why inverted is the default, by measurement (bench/kernels.py, one H200, bf16, B=1, T=65536,
Hq=64, G=4, D=128, l'=64, n=16): the whole selection backward takes 35.3 ms inverted against
399.5 ms atomic (11x; 8.9x at T=8192). The atomic variant issues n * l' * (Dk + Dv) * T * G ≈
6.9e10 float32 atomic adds (~275 GB of read-modify-write, neighbouring queries hitting the same
addresses) and forms dK/dV from 16-row tiles; the inverted one issues
(T*n*G/sel_chunk + Ts*G) * l' * (Dk + Dv) ≈ 1.3e8 and uses 128-row tiles (64 rows at 4 warps
for bf16 128-wide heads since, ``BlockSizes.for_shape``). Its index costs one sort of T*n*G pairs
(2.4 ms at that shape then; 0.31 ms on an H100 as one flat radix sort, ``inverted_index``).
Indices are not differentiable.

Packed documents (``seg``, a ``semantics.SegmentLayout``; None compiles the unpacked kernels):
ids are document-relative, so block j of the query at t is the keys [p, p + l'),
p = start(t) + j*l' (an unaligned ``pl.ds`` load), kept where s <= t (s >= start holds by
construction). The block -> query index keys each (query, block) pair by a *key range* of l'
keys (``slot_keys``): the aligned block J = floor(p / l') when the keys the query sees,
[p, min(p + l', t + 1)), lie inside it, else the range that starts at p itself (the document
block crosses the aligned boundary (J + 1) l'; one document block can cross a given boundary,
so this range is "boundary J", id Ts + J). Each entry carries p and masks keys to
[p, p + l'), so a pair is one entry and one slot, as in unpacked rows; a work item's K/V tile
starts at its range's first key (``inverted_index``'s meta), and the ranges number at most
2 Ts - 1, a static bound whatever the documents' lengths. The atomic variant adds at p directly.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices
from nsa_jax.pallas import atomics
from nsa_jax.pallas.common import (LOG2E, POS_INF, BlockSizes, cdiv, choices_or_default,
                                   compiler_params, dot, dot_precision, dscores, fold_gate, idiv,
                                   load, next_pow2, probs, sel_sub_tiles, store)
from nsa_jax.pallas.selection_query import (sel_dq, sel_dq_from_ds,  # noqa: F401 (re-exported)
                                            sel_forward)


def atomic_mode(choices: KernelChoices | None) -> bool:
    return choices_or_default(choices).sel_bwd == "atomic"


# ---- backward: dK/dV through the inverted block -> query index -------------------------------
# Work items of the block -> query index (``inverted_index``): the dK/dV kernel below and the
# block-major forward and fused backward (``selection_block``) read them the same way.
def item_tiles(bs: BlockSizes, h: int, rows: int | None = None):
    """-> (rows, chunk): (query, head) rows per tile (``rows``, default ``bs.sel_rows``, at
    least one query's h heads) and queries per work item of the index (``bs.sel_chunk`` rounded
    up to whole ``bs.sel_rows`` tiles; a kernel with other rows reads the same items, its last
    tile of an item partly masked)."""
    bq = max(bs.sel_rows, next_pow2(h)) // h
    return max(rows or bs.sel_rows, next_pow2(h)), bq * cdiv(bs.sel_chunk, bq)


def work_item(meta_ref, h: int, rows: int):
    """This program's work item -> (b, g, base = its key range's first key, start, count) and
    its tile rows (query qi of the tile, head), ``rows // h`` queries x h heads per tile."""
    ci = pl.program_id(0)
    b, g, base = meta_ref[ci, 0], meta_ref[ci, 1], meta_ref[ci, 2]
    start, count = meta_ref[ci, 3], meta_ref[ci, 4]
    qi = idiv(jnp.arange(rows), h)
    head = g * h + (jnp.arange(rows) - qi * h)
    return b, g, base, start, count, qi, head


def item_entries(qt_ref, b, g, start, count, it, qi, bq: int):
    """Tile ``it`` of a work item -> (row_ok, entry index into qt, qt's payload; 0 where not
    row_ok)."""
    e = it * bq + qi
    row_ok = (qi < bq) & (e < count)
    ent = jnp.where(row_ok, start + e, 0)
    return row_ok, ent, jnp.where(row_ok, load(qt_ref.at[b, g, ent], row_ok), 0)


def diagonal_count(qt_ref, b, g, base, start, count, n_slots: int, l_sel: int):
    """How many of a work item's entries have a query that sees only part of the item's key
    block (t < base + l' - 1, i.e. the causal mask hides some key): a prefix of the item, since
    its entries ascend by t. The index lists a block only for queries at or past its first key
    (``slot_keys``) and each query once, so there are at most l' - 1 of them, all among the
    item's first next_pow2(l') entries: one vector load. Unpacked rows only (a packed entry's
    range starts at its own p). ``n_slots``: n of the index's slot payloads (t*n + slot)."""
    e = jnp.arange(next_pow2(l_sel))
    ok = e < count
    t = idiv(load(qt_ref.at[b, g, jnp.where(ok, start + e, 0)], ok), n_slots)
    return jnp.sum((ok & (t < base + (l_sel - 1))).astype(jnp.int32))


def item_part(qt_ref, b, g, base, start, count, n_slots: int, l_sel: int, part):
    """A work item's entries for one launch of a causally split kernel -> (start, count):
    ``part`` "diag" the prefix whose queries see part of the block (``diagonal_count``, run with
    the causal mask), "rest" the entries after it (every key visible: no mask), None all."""
    if part is None:
        return start, count
    nd = diagonal_count(qt_ref, b, g, base, start, count, n_slots, l_sel)
    return (start, nd) if part == "diag" else (start + nd, count - nd)


def causal_parts(l_sel: int, bk: int, packed: bool):
    """The launches of the block-major forward: ("diag", "rest") where the unmasked part can run
    without any mask (unpacked rows, key sub-tiles inside the block), else (None,): one launch
    with the mask on every tile. Two launches rather than two loops in one kernel: a kernel
    holding both loops took 182 registers against 160 and ran slower (thirty-sixth session).
    On an H200 at the 125M shape the two launches took the forward 0.618 -> 0.537 ms at 8k / B=4
    and 1.301 -> 1.162 at 64k; the fused backward split the same way got slower (1.401 ->
    1.525 and 3.046 -> 3.541 ms: its unmasked launch alone was no faster than the masked one),
    and again with relaxed dK/dV atomics (1.327 -> 0.149 + 1.244 ms at 8k), so it keeps one
    masked launch (bench/NOTES.md, thirty-ninth and fortieth sessions)."""
    return (None,) if packed or l_sel % bk else ("diag", "rest")


def item_rows(q_ref, do_ref, lse_ref, delta_ref, b, t, head, row_ok, cdt):
    """A backward tile's per-row operands for tile rows (query t, head): q, dO (cast to the
    compute dtype ``cdt``), the saved base-2 lse with the gate folded in (+inf on masked rows, so
    their recomputed p is 0) and delta (``common.fold_gate``); rows where ``row_ok`` is False
    load 0."""
    dk_, dv_ = jnp.arange(q_ref.shape[-1]), jnp.arange(do_ref.shape[-1])
    q = load(q_ref.at[b, t[:, None], head[:, None], dk_[None, :]], row_ok[:, None])
    do = load(do_ref.at[b, t[:, None], head[:, None], dv_[None, :]], row_ok[:, None]).astype(cdt)
    return (q, do, load(lse_ref.at[b, t, head], row_ok, POS_INF),
            load(delta_ref.at[b, t, head], row_ok))


def block_kv(k_ref, v_ref, b, g, base, sub: int, bk: int, l_sel: int):
    """Sub-tile ``sub`` of the key block starting at ``base`` -> (k, v, key positions, kcol):
    ``kcol`` [bk] bool, the sub-tile's keys inside the block (off < l'), or None where all are
    (known when tracing: only a sub-tile reaching past l' needs it in its mask). Keys past K's
    end load as 0; no mask needs them, since causality already hides them (``item_mask``)."""
    off = sub * bk + jnp.arange(bk)
    kpos = base + off
    kvalid = (off < l_sel) & (kpos < k_ref.shape[1])
    kcol = None if (sub + 1) * bk <= l_sel else off < l_sel
    return (load(k_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None]),
            load(v_ref.at[b, pl.ds(base + sub * bk, bk), g, :], kvalid[:, None]), kpos, kcol)


def item_mask(kcol, kpos, t, p0, l_sel: int):
    """[rows, bk] keys a tile row sees: causal (s <= t), inside the block (``kcol``, None: all
    of the sub-tile) and, packed (``p0`` not None), its block's keys [p0, p0 + l') (the item's
    key range may begin before p0: an aligned block).

    Two conditions are left out: nothing depends on them, and each cost a select per logit (the
    sm_90 proxy compiled them as three passes over the tile; the block forward went -20% on an
    H200 without them and two more changes, bench/NOTES.md, thirty-seventh session). Keys past
    K's end: s <= t < T already hides them. Rows past the tile's count (``item_entries``'
    row_ok): the forward never stores them, and the backward loads their lse as +inf
    (``item_rows``), so their p is 0."""
    mask = kpos[None, :] <= t[:, None]
    if kcol is not None:
        mask = mask & kcol[None, :]
    if p0 is not None:
        mask = mask & (kpos[None, :] >= p0[:, None]) & (kpos[None, :] < p0[:, None] + l_sel)
    return mask


def _bwd_kv_kernel(meta_ref, qt_ref, *refs, h, rows, l_sel, bk, n_sub, scale, prec,
                   packed=False, n_slots=0, store_ds=False):
    """dK/dV of one work item (a key block and a chunk of its queries); with ``store_ds`` also
    each tile's dS, rounded to the input dtype, at its entries' rows of the [B*G, T*n*h + pad,
    L] buffer (entry-order layout: ``sel_backward``)."""
    if packed:
        pt_ref, *refs = refs
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, _dk_in, _dv_in, dk_ref, dv_ref,
     *ds_ref) = refs
    b, g, base, start, count, qi, head = work_item(meta_ref, h, rows)
    G = q_ref.shape[2] // h
    Dk, Dv = q_ref.shape[-1], v_ref.shape[-1]
    cdt = q_ref.dtype
    bq = rows // h
    c = scale * LOG2E
    n_tiles = idiv(count + (bq - 1), bq)

    for sub in range(n_sub):
        k, v, kpos, kcol = block_kv(k_ref, v_ref, b, g, base, sub, bk, l_sel)

        def tile(it, carry, k=k, v=v, kpos=kpos, kcol=kcol, sub=sub):
            dk, dv = carry
            row_ok, ent, t = item_entries(qt_ref, b, g, start, count, it, qi, bq)
            if n_slots:   # an index built with slots (the block-major forward's): t*n + slot
                t = idiv(t, n_slots)
            q, do, lse, delta = item_rows(q_ref, do_ref, lse_ref, delta_ref, b, t, head,
                                          row_ok, cdt)
            # common.dkv_accumulate's steps, inline: the "ds" mode stores dS between its dots
            s = dot(q, k, trans_b=True, precision=prec)   # raw; scaled in the exponent
            p0 = load(pt_ref.at[b, g, ent], row_ok) if packed else None
            p = probs(s, item_mask(kcol, kpos, t, p0, l_sel), lse, c)
            dv = dv + dot(p.astype(cdt), do, trans_a=True, precision=prec)   # the gate is in p
            ds = dscores(p, do, v, None, delta, prec).astype(cdt)
            if store_ds:   # the tile's entries are consecutive: one contiguous [rows, bk] block
                r0 = (start + it * bq) * h
                store(ds_ref[0].at[b * G + g, pl.ds(r0, rows), pl.ds(sub * bk, bk)], ds,
                      row_ok[:, None])
            dk = dk + dot(ds, q, trans_a=True, precision=prec)
            return dk, dv

        dk, dv = lax.fori_loop(0, n_tiles, tile, (jnp.zeros((bk, Dk), jnp.float32),
                                                  jnp.zeros((bk, Dv), jnp.float32)))

        @pl.when(count > 0)
        def _add(dk=dk, dv=dv, sub=sub):
            atomics.add(dk_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dk)), dk * scale)
            atomics.add(dv_ref, (b, pl.ds(base + sub * bk, bk), g, pl.ds(0, Dv)), dv)


ONE_KEY_MAX = 2 ** 31 - 1   # most flat (row, range) keys inverted_index sorts in one sort
SHORT_KEY_MAX = 2 ** 16     # ... as 16-bit keys


def num_ranges(Ts: int, packed: bool) -> int:
    """Key ranges of the block -> query index, also the id ``slot_keys`` gives an unused slot:
    the Ts aligned blocks, and packed, the Ts - 1 ranges that start at a document block
    crossing an aligned boundary (J + 1) l' < Ts l' (module docstring)."""
    return 2 * Ts - 1 if packed else Ts


def slot_keys(idx, T: int, Ts: int, doc_start=None, l_sel: int = 0, pos0=0):
    """The key range each (query, slot) entry of the inverted index is listed under: int32
    [B,T,G,n], ``num_ranges`` where the slot is unused or its block starts past the query (no
    key of it is visible: the entry would add nothing, and leaving it out keeps every listed
    query at or past its block's first key, which ``diagonal_count`` relies on). Unpacked: the
    selected ids (``l_sel`` = l'; 0 keeps blocks past the query).
    Packed (``doc_start`` [B,T], idx document-relative): with p = start + idx*l' the block's
    first key and J = floor(p / l'), the aligned block J when the keys the query sees,
    [p, min(p + l', t + 1)), lie in it, else Ts + J (the range from p across (J + 1) l').
    ``pos0`` (unpacked; int or traced int32): row t's key position is pos0 + t (a continuation
    chunk's queries over a longer cache)."""
    nr = num_ranges(Ts, doc_start is not None)
    tpos = jnp.arange(T, dtype=jnp.int32)[None, :, None, None] + pos0
    if doc_start is None:
        ok = (idx >= 0) & (idx < Ts)
        if l_sel:
            ok = ok & (idx * l_sel <= tpos)
        return jnp.where(ok, idx, nr).astype(jnp.int32)
    p = doc_start[:, :, None, None] + jnp.maximum(idx, 0) * l_sel
    j0 = p // l_sel
    cross = (p % l_sel != 0) & ((j0 + 1) * l_sel <= tpos)
    keys = jnp.where(cross, Ts + j0, j0)
    return jnp.where((idx >= 0) & (p <= tpos), keys, nr).astype(jnp.int32)


def _count_below(rows, nv: int):
    """int32 [R, nv + 1]: entry k counts the values of each row below k, i.e. entry k + 1 those
    <= k (``jnp.searchsorted`` side "left" for the bounds 0..nv, or "right" for 0..nv-1).
    Each row must be sorted ascending with values >= 0; values >= nv count as nv (none of the
    bounds counts them). ``inverted_index``'s sorted keys and cumulative item ends are.

    On sorted rows, the count below k is the position of the first value >= k. So each run's
    first entry writes its position to its value's bin (one scatter of unique targets; the
    other entries are dropped), and a reverse running minimum fills the bins no value hits
    with the next bin's position. A histogram (a scatter-add) counted the same with one atomic
    add per value, and on sorted rows all the adds of one run hit one address: 0.26 ms per
    call at 125M 64k on an H200, 6.3 ms per train step (bench/NOTES.md, eleventh session)."""
    R, N = rows.shape
    c = jnp.minimum(rows, nv).astype(jnp.int32)                  # still sorted
    prev = jnp.concatenate([jnp.full((R, 1), -1, jnp.int32), c[:, :-1]], axis=1)
    tgt = jnp.where(c != prev, c, nv + 1)                        # run starts; nv + 1 dropped
    pos = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (R, N))
    first = jnp.full((R, nv + 1), N, jnp.int32).at[jnp.arange(R)[:, None], tgt].set(
        pos, mode="drop")
    return lax.cummin(first, axis=1, reverse=True)


def inverted_index(idx, T: int, Ts: int, chunk: int, l_sel: int, doc_start=None,
                   slots: bool = False, pos0=0):
    """Block -> query index of a selection, split into work items of <= ``chunk`` queries.

    idx [B,T,G,n] (block ids, -1 unused) -> (meta int32 [NC, 5] rows (b, g, base, start,
    count), qt int32 [B,G,T*n]: for each (b, g) the query positions sorted by (key range,
    query)). Work item c covers ``qt[b, g, start:start+count]``, all of which selected the l'
    keys from ``base`` on (unpacked: block j, base = j*l'). NC is a static upper bound; unused
    items have count 0.

    Packed rows (``doc_start`` [B,T] document starts): idx is document-relative; each (query,
    block) pair is listed once, under the key range of ``slot_keys`` (an aligned block, or the
    range starting at the block's first key p when the block crosses an aligned boundary before
    t), and a third output pt [B,G,T*n] holds each entry's p (module docstring).

    ``slots``: qt holds t*n + i instead of t, where i < n is the entry's slot (its position in
    idx's last axis), so a kernel can write a result per (query, slot) (``selection_block``).
    ``pos0`` (unpacked): query row t sits at key position pos0 + t (``slot_keys``); qt holds
    rows, Ts counts the key blocks (a continuation chunk's cache: more than T / l').
    """
    B, _, G, n = idx.shape
    packed = doc_start is not None
    nr = num_ranges(Ts, packed)
    jkey = slot_keys(idx, T, Ts, doc_start, l_sel, pos0)
    TN = T * n
    # entry e = t*n + slot, in (b, g) rows, sorted by (range, e): one stable sort of the flat
    # (row, range) keys carrying e. Flat, so XLA hands it to CUB's radix sort (a batch of rows it
    # sorts itself, ~10x slower on an H100 at the bench shape: bench/NOTES.md, sixteenth
    # session), and with 16-bit keys where the (row, range) pairs fit (2 radix passes)
    jkey = jkey.transpose(0, 2, 1, 3).reshape(B * G, TN)
    ent = jnp.broadcast_to(jnp.arange(TN, dtype=jnp.int32), (B * G, TN))
    n_keys = B * G * (nr + 1)
    if n_keys <= ONE_KEY_MAX:
        kdt = jnp.uint16 if n_keys <= SHORT_KEY_MAX else jnp.uint32
        row0 = jnp.arange(B * G, dtype=jnp.int32)[:, None] * (nr + 1)
        ks, esort = lax.sort(((row0 + jkey).reshape(-1).astype(kdt), ent.reshape(-1)),
                             dimension=0, num_keys=1, is_stable=True)
        jsort = ks.reshape(B * G, TN).astype(jnp.int32) - row0
    else:
        jsort, esort = lax.sort((jkey, ent), dimension=-1, num_keys=2)
    jsort, esort = jsort.reshape(B, G, TN), esort.reshape(B, G, TN)
    tsort = esort // n
    if packed:   # each entry's first key p = start(t) + j*l'
        j_e = jnp.take_along_axis(idx.transpose(0, 2, 1, 3).reshape(B, G, TN), esort, axis=-1)
        st = jnp.take_along_axis(jnp.broadcast_to(doc_start[:, None, :], (B, G, T)), tsort,
                                 axis=-1)
        psort = (st + jnp.maximum(j_e, 0) * l_sel).astype(jnp.int32)
    if slots:
        tsort = esort
    starts = _count_below(jsort.reshape(B * G, TN), nr).reshape(B, G, nr + 1)
    cnt = (starts[..., 1:] - starts[..., :-1]).reshape(-1)  # [B*G*nr]
    first = starts[..., :-1].reshape(-1)
    nch = (cnt + chunk - 1) // chunk
    ends = jnp.cumsum(nch)
    NC = B * G * (cdiv(TN, chunk) + nr)
    cid = jnp.arange(NC, dtype=jnp.int32)
    blk = _count_below(ends[None], NC)[0, 1:]   # #(ends <= c), c < NC
    live = blk < B * G * nr
    blk = jnp.minimum(blk, B * G * nr - 1)
    within = cid - (ends[blk] - nch[blk])
    start = first[blk] + within * chunk
    count = jnp.where(live, jnp.clip(cnt[blk] - within * chunk, 0, chunk), 0)
    bb, rem = blk // (G * nr), blk % (G * nr)
    g, r = rem // nr, rem % nr
    base = r * l_sel
    if packed:   # a crossing range starts at its entries' (common) first key
        p_first = psort.reshape(-1)[(bb * G + g) * TN + jnp.clip(start, 0, TN - 1)]
        base = jnp.where(r >= Ts, p_first, base)
    meta = jnp.stack([bb, g, base, start, count], axis=-1).astype(jnp.int32)
    return (meta, tsort) if not packed else (meta, tsort, psort)


def dkv_rows(T: int, Ts: int, l_sel: int, bk: int, n_sub: int, packed: bool) -> int:
    """Rows of the float32 dK/dV accumulators the block-major and inverted kernels add into:
    every tile [base + sub*bk, +bk) stays in bounds (packed: a range may start at any p < T)."""
    rows = Ts * l_sel + bk   # unpacked: tiles [j*l' + sub*bk, +bk), j < Ts
    return max(rows, T + n_sub * bk) if packed else rows


def sel_backward(q, k, v, idx, o, lse, do, gs, cfg: NSAConfig, bs: BlockSizes, scale: float,
                 interpret: bool, *, choices: KernelChoices | None = None, seg=None,
                 index=None):
    """-> dq (float32), dk, dv (input dtypes) for the output cotangent ``gs[..., None] * do``;
    dK/dV by ``choices.sel_bwd`` ("inverted" or "atomic"), dQ by ``choices.sel_dq``: the
    per-query kernel, or with "ds" from the dS the inverted dK/dV kernel stores (module
    docstring). ``index``: the block -> query index of a one-pass block-major forward
    (``selection_block.sel_forward_block(return_index=True)``: (meta, qt[, pt]) with slot
    payloads t*n + slot), reused by the inverted dK/dV (and "ds") instead of a second sort.

    ``do`` [B,T,Hq,Dv] is the cotangent as it arrives (bf16 stays bf16: it feeds the dots
    unrounded) and ``gs`` [B,T,Hq] a per-row scale >= 0 (the branch gate; None = 1), folded into
    the saved lse (``common.fold_gate``: P' = gs P, no gs in the kernels). ``seg``: packed
    rows' layout (document-relative idx).
    """
    B, T, Hq, Dk = q.shape
    G, Dv = k.shape[2], v.shape[-1]
    h = Hq // G
    n = idx.shape[-1]
    bk, n_sub = sel_sub_tiles(cfg.sel_block, bs.sel_keys)
    prec = dot_precision(q.dtype, interpret, choices)
    Ts = cfg.num_sel_blocks(T)
    packed = seg is not None
    atomic = atomic_mode(choices)
    T_acc = dkv_rows(T, Ts, cfg.sel_block, bk, n_sub, packed)
    if atomic:  # the per-query dQ kernel adds its tiles in its own steps (sel_q_keys)
        T_acc = max(T_acc, dkv_rows(T, Ts, cfg.sel_block,
                                    *sel_sub_tiles(cfg.sel_block, bs.sel_q_keys), packed))
    lse, delta = fold_gate(lse, gs, o, do)
    acc = [jnp.zeros((B, T_acc, G, Dk), jnp.float32), jnp.zeros((B, T_acc, G, Dv), jnp.float32)]
    if atomic:
        dq, dk, dv = sel_dq(q, k, v, idx, do, lse, delta, cfg, bs, prec, scale, interpret,
                            seg=seg, acc=acc)
        return dq, dk[:, :T].astype(k.dtype), dv[:, :T].astype(v.dtype)
    use_ds = ds_mode(choices, packed)
    if not use_ds:
        dq = sel_dq(q, k, v, idx, do, lse, delta, cfg, bs, prec, scale, interpret, seg=seg)
    rows, chunk = item_tiles(bs, h)
    if index is not None:           # the block-major forward's: slot payloads t*n + slot
        meta, *qt = index
        n_slots = n
    else:
        meta, *qt = inverted_index(idx, T, Ts, chunk, cfg.sel_block,
                                   seg.start if packed else None, slots=use_ds)
        n_slots = n if use_ds else 0
    qt = tuple(qt)
    kern = functools.partial(_bwd_kv_kernel, h=h, rows=rows, l_sel=cfg.sel_block, bk=bk,
                             n_sub=n_sub, scale=scale, prec=prec, packed=packed,
                             n_slots=n_slots, store_ds=use_ds)
    out_shape = [jax.ShapeDtypeStruct(acc[0].shape, jnp.float32),
                 jax.ShapeDtypeStruct(acc[1].shape, jnp.float32)]
    if use_ds:   # rows past T*n*h: the last tile's masked rows address them (never written)
        out_shape.append(jax.ShapeDtypeStruct((B * G, T * n * h + rows, n_sub * bk), q.dtype))
    dk, dv, *ds = pl.pallas_call(
        kern, grid=(meta.shape[0],), out_shape=out_shape,
        input_output_aliases={7 + len(qt): 0, 8 + len(qt): 1},
        compiler_params=compiler_params(bs.sel_bwd_warps or bs.num_warps, bs.num_stages),
        interpret=interpret, name="nsa_sel_bwd_dkv",
    )(meta, *qt, q, k, v, do, lse, delta, *acc)
    if use_ds:
        dq = sel_dq_from_ds(k, idx, ds[0], entry_positions(qt[0]), h, cfg, bs, prec, scale,
                            interpret)
    return dq, dk[:, :T].astype(k.dtype), dv[:, :T].astype(v.dtype)


def entry_positions(qt):
    """The inverse of the index's sort: qt [B,G,T*n] with slot payloads (t*n + slot, each once
    per (b, g) row) -> int32 [B,G,T*n], the position in qt of entry t*n + slot (one scatter of
    unique targets)."""
    B, G, TN = qt.shape
    pos = jnp.broadcast_to(jnp.arange(TN, dtype=jnp.int32), qt.shape)
    return jnp.zeros_like(pos).at[jnp.arange(B)[:, None, None], jnp.arange(G)[None, :, None],
                                  qt].set(pos, unique_indices=True)


def ds_mode(choices: KernelChoices | None, packed: bool) -> bool:
    """Whether the inverted backward forms dQ from the dK/dV kernel's stored dS
    (``KernelChoices.sel_dq = "ds"``). Packed rows never do: a packed work item's key range need
    not start at the query's block, so an entry's dS columns would not be its block's keys
    (explicit "ds" is refused)."""
    ch = choices_or_default(choices)
    if ch.sel_dq == "ds" and packed:
        raise ValueError("kernel.sel_dq: 'ds' takes unpacked rows only; packed documents "
                         "(segment_ids) need 'query' or 'block'")
    return ch.sel_dq == "ds"


# ---- custom VJP ---------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def selection_attention(q, k, v, idx, cfg: NSAConfig, bs: BlockSizes, scale: float,
                        interpret: bool):
    """Selected-block attention -> o float32 [B,T,Hq,Dv]. ``idx`` int32 [B,T,G,n] (-1 unused);
    ids must be distinct per (b, t, g), as ``topn_from_scores`` makes them."""
    return sel_forward(q, k, v, idx, cfg, bs, scale, interpret)[0]


def _vjp_fwd(q, k, v, idx, cfg, bs, scale, interpret):
    o, lse = sel_forward(q, k, v, idx, cfg, bs, scale, interpret)
    return o, (q, k, v, idx, o, lse)


def _vjp_bwd(cfg, bs, scale, interpret, res, do):
    q, k, v, idx, o, lse = res
    dq, dk, dv = sel_backward(q, k, v, idx, o, lse, do, None, cfg, bs, scale, interpret)
    return dq.astype(q.dtype), dk, dv, None


selection_attention.defvjp(_vjp_fwd, _vjp_bwd)
