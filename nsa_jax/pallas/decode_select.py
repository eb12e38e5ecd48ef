"""The Pallas decode step's block selection (NSA Eq. 9-11 for one token per row): the group-summed
block scores from the compressed kernel's logits and the top-n, as two kernels. Used by
:func:`nsa_jax.pallas.decode.nsa_decode_pallas` (its module docstring has the whole step).

``_score_kernel`` (grid B x G x chunks of selection blocks) merges the compressed kernel's
per-split lse into each head's, forms the group-summed block scores
(Eq. 9-10) from the logits (one row load and one small tail gather per head) and keeps each
chunk's top-n with the forced blocks (Eq. 11); ``_topn_merge_kernel`` (grid B x G x candidate
slices) picks the top-n of the chunks' candidates. Both rank by counting (a candidate's rank is
the number of candidates ahead of it: higher score, or equal score and lower index, the rules of
:mod:`nsa_jax.nsa.semantics`), one comparison matrix and one reduction instead of n serial
rounds of argmax (measured slower: bench/NOTES.md, thirteenth session). The ids come out in
score order, forced blocks first.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from nsa_jax.pallas.common import NEG_INF, cdiv, compiler_params, load, next_pow2, store

TARGET_PROGRAMS = 264  # ~2 programs per SM of an H100/H200 (132 SMs): block scoring
SEL_CHUNKS = (32, 128)  # selection blocks per scoring program: the range of the default
MERGE_TILE = 32         # candidates per program (and per compared slice) of the top-n merge: 32
                        # took 0.8 us per layer less than 64 at 128k / B=64, 128k / B=8, 64k / B=8
                        # and 64k / B=1, even at 8k / B=64, 128 slower (H100; NOTES, 29th session)
SCORE_WARPS = (8, 4, 2)  # warps per scoring program: few long programs / the rest / many programs
SCORE_MID = 1024        # scoring programs (B x G x chunks) from which each gets 4 warps
SCORE_MANY = 2048       # ... and from which each gets 2


def default_chunk(B: int, G: int, Ts: int) -> int:
    """Default selection blocks per scoring program: about TARGET_PROGRAMS programs in all, a
    power of two in SEL_CHUNKS. Smaller chunks shorten each program; larger ones leave fewer
    candidates to merge (H200, 125M shape: 32 at 64k/B=1, 64 at 64k/B=8, 128 at 128k/B=64 were
    the fastest of 32/64/128; bench/NOTES.md)."""
    lo, hi = SEL_CHUNKS
    return int(min(hi, max(lo, next_pow2(cdiv(Ts * B * G, TARGET_PROGRAMS)))))


def default_score_warps(B: int, G: int, Ts: int, chunk: int) -> int:
    """Warps per scoring program. The kernel is issue-bound (most of its instructions are the
    chunk's [chunk x chunk] rank count; Nsight Compute, bench/NOTES.md, twenty-ninth session), so
    the warps only change how its programs share the SMs: 8 below SCORE_MID programs of chunks of
    >= 64 blocks (each program uses more of an SM), 2 from SCORE_MANY programs on (more programs
    fit on an SM at once), else 4. H100, 125M shape, one cache set per layer, us per layer with 2 /
    4 / 8 warps: 128k / B=64 (2,048 programs of 128 blocks) 17.4 / 20.5 / 22.8; 64k / B=64 (1,024
    of 128) 15.1 / 11.1 / 12.0; 32k / B=64 (512 of 128) 13.1 / 8.3 / 6.4; 8k / B=64 (256 of 64) 5.1 /
    5.0 / 3.1; 64k / B=8 (256 of 64) 5.4 / 4.3 / 3.2; 128k / B=8 (256 of 128) 7.1 / 5.4 / 4.9; 64k /
    B=1 (64 of 32) 5.0 / 2.5 / 4.1."""
    few, mid, many = SCORE_WARPS
    programs = B * G * cdiv(Ts, chunk)
    if programs >= SCORE_MANY:
        return many
    return few if programs < SCORE_MID and chunk >= 64 else mid


def _merged_lse(lse_ref, b, g, h, spp):
    """The per-split lse of all h heads of (b, g) (axis 2 of ``lse_ref`` [B,G,splits,h]: base 2,
    -inf for a split without a visible key) as one [spp, hp] load, merged by log-add-exp over
    the splits -> [hp] base-2 lse (-inf where no key is visible, so the scoring kernel reads no
    logit of that head; padded heads -inf). XLA ran this merge as two kernels per layer."""
    S = lse_ref.shape[2]
    sp = jnp.arange(spp)
    hr = jnp.arange(next_pow2(h))
    ok = (sp < S)[:, None] & (hr < h)[None, :]
    own = load(lse_ref.at[b, g, jnp.minimum(sp, S - 1)[:, None], jnp.minimum(hr, h - 1)[None, :]],
               ok, NEG_INF)
    M = jnp.max(own, axis=0)
    safe = jnp.where(M == NEG_INF, 0.0, M)
    return M + jnp.log2(jnp.sum(jnp.exp2(own - safe[None, :]), axis=0)), hr


def _ahead(v, i, vj, ij):
    """[len(v), len(vj)]: candidate (vj, ij) ranks before (v, i): a higher value, or the same
    value and a lower index (the ``lax.top_k`` order of ``semantics``)."""
    return (vj[None, :] > v[:, None]) | ((vj[None, :] == v[:, None]) & (ij[None, :] < i[:, None]))


def _score_kernel(t_ref, s_ref, lse_ref, val_ref, idx_ref, *, h, r, mm, cs, mmp, n_sel,
                  n_init, n_local, l_cmp, d_cmp, l_sel, ts, spp):
    """Group-summed block scores (Eq. 9-10) of one chunk of selection blocks of one (row, group),
    forced / non-candidate blocks at +-inf (Eq. 11), and the chunk's top-n (value, id) pairs.

    Eq. 9 as :mod:`nsa_jax.nsa.semantics` writes it, score_j = sum_{u<r} sum_{k<mm}
    p[j*mm + k - u], is read as block j's own row p[j*mm + o] (o < mm) with weight
    min(r, mm - o) plus the previous row's last r - 1 logits p[j*mm - e] (0 < e < r) with weight
    min(r - e, mm): one contiguous [cs, mm] load and one [cs, r - 1] tail gather per head, instead
    of r overlapping [cs, mm] loads (each tail logit is also its own block's, so it is read twice,
    the rest once).

    ``lse_ref`` [B,G,splits,h]: the compressed kernel's per-split base-2 lse, merged per head
    here for all heads in one load before the head loop (``_merged_lse``, ``spp`` = splits padded
    to a power of two): a few hundred bytes per program instead of two XLA kernels per layer
    between the compressed and the scoring kernel (bench/NOTES.md, nineteenth session).

    The chunk's top-n is a rank count, not n rounds of argmax: block i's rank is the number of
    blocks of the chunk ahead of it (``_ahead``), one [cs, cs] comparison and one reduction; the
    blocks ranked < n go to slot rank, the slots past the chunk's candidates get (-inf, Ts).
    """
    b, g, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    Tc, Ts = s_ref.shape[-1], ts
    t = t_ref[b]
    nvis = jnp.minimum(jnp.where(t + 1 >= l_cmp, (t + 1 - l_cmp) // d_cmp + 1, 0), Tc)
    j = c * cs + jnp.arange(cs)
    k = jnp.arange(mmp)
    own = j[:, None] * mm + k[None, :]                              # [cs, mmp] logit indices
    ok_own = (k < mm)[None, :] & (own < nvis)
    w_own = jnp.minimum(r, mm - k).astype(jnp.float32)[None, :]
    own = jnp.minimum(own, Tc - 1)
    # the tail as a [cs, rp] tile reduced over axis 1 like the own row (not a 1-D vector: every
    # term then shares the row sum's layout, no conversion between two vector layouts per head)
    e = 1 + jnp.arange(max(1, next_pow2(r - 1)))
    tail = j[:, None] * mm - e[None, :]
    ok_tail = (e < r)[None, :] & (tail >= 0) & (tail < nvis)
    w_tail = jnp.minimum(r - e, mm).astype(jnp.float32)[None, :]
    tail = jnp.clip(tail, 0, Tc - 1)
    score = jnp.zeros((cs,), jnp.float32)
    lse, hr = _merged_lse(lse_ref, b, g, h, spp)      # one load for all heads, before the loop
    for hh in range(h):
        lse_h = jnp.sum(jnp.where(hr == hh, lse, 0.0))
        sv = load(s_ref.at[b, g, hh, own], ok_own, NEG_INF)
        part = jnp.where(ok_own, jnp.exp2(sv - lse_h) * w_own, 0.0)
        if r > 1:
            sv = load(s_ref.at[b, g, hh, tail], ok_tail, NEG_INF)
            part = jnp.sum(part, axis=1) + jnp.sum(
                jnp.where(ok_tail, jnp.exp2(sv - lse_h) * w_tail, 0.0), axis=1)
        else:
            part = jnp.sum(part, axis=1)
        score = score + part
    cur = t // l_sel
    cand = j <= cur
    forced = cand & ((j < n_init) | (j > cur - n_local))
    sc = jnp.where(forced, float("inf"), jnp.where(cand, score, NEG_INF))
    rank = jnp.sum(_ahead(sc, j, sc, j).astype(jnp.int32), axis=1)
    win = cand & (rank < n_sel)
    K = val_ref.shape[-1]
    at = jnp.where(win, c * n_sel + rank, K)
    store(val_ref.at[b, g, at], sc, win)
    store(idx_ref.at[b, g, at], j, win)
    count = jnp.minimum(jnp.sum(cand.astype(jnp.int32)), n_sel)
    slot = jnp.arange(next_pow2(n_sel))
    pad = (slot >= count) & (slot < n_sel)
    at = jnp.where(pad, c * n_sel + slot, K)
    store(val_ref.at[b, g, at], jnp.full(slot.shape, NEG_INF, jnp.float32), pad)
    store(idx_ref.at[b, g, at], jnp.full(slot.shape, Ts, jnp.int32), pad)


def _topn_merge_kernel(val_ref, idx_ref, ids_ref, *, n_sel, kt):
    """Top-n over the chunks' candidates by the same rank count, in slices of ``kt``: program p
    ranks candidates [p*kt, (p+1)*kt) against all of them and writes the winners to slot rank
    (value order: forced blocks first); program 0 also writes -1 to the slots past the number of
    candidates."""
    b, g, p = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    K = val_ref.shape[-1]

    def cands(lo):
        e = lo + jnp.arange(kt)
        ok = e < K
        v = load(val_ref.at[b, g, jnp.minimum(e, K - 1)], ok, NEG_INF)
        return v, load(idx_ref.at[b, g, jnp.minimum(e, K - 1)], ok, 2 ** 30)

    v, i = cands(p * kt)
    ahead = jnp.zeros((kt, kt), jnp.int32)   # summed over the slices, reduced once
    valid = jnp.zeros((kt,), jnp.int32)
    for lo in range(0, K, kt):
        vj, ij = cands(lo)
        ahead += _ahead(v, i, vj, ij).astype(jnp.int32)
        valid += (vj > NEG_INF).astype(jnp.int32)
    rank = jnp.sum(ahead, axis=1)
    count = jnp.sum(valid)
    win = (v > NEG_INF) & (rank < n_sel)
    store(ids_ref.at[b, g, jnp.where(win, rank, n_sel)], i, win)
    slot = jnp.arange(next_pow2(n_sel))
    pad = (p == 0) & (slot >= count) & (slot < n_sel)
    store(ids_ref.at[b, g, jnp.where(pad, slot, n_sel)], jnp.full(slot.shape, -1, jnp.int32), pad)


def chunk_candidates(t, s, lse, cfg, Ts, sel_chunk, interpret, warps=None):
    """The scoring kernel: -> (values, ids) [B,G,chunks*n_sel], each chunk's top-n group-summed
    block scores (Eq. 9-10; forced blocks +inf, empty slots -inf with id Ts) from the compressed
    kernel's logits ``s`` [B,G,h,Tc] and per-split lse [B,G,splits,h]; ``warps`` per program
    (default: :func:`default_score_warps`)."""
    B, G, h, _ = s.shape
    r, mm = cfg.block_l // cfg.stride_d, cfg.sel_block // cfg.stride_d
    cs = max(sel_chunk if Ts > sel_chunk else next_pow2(Ts), next_pow2(cfg.n_sel))
    C = cdiv(Ts, cs)
    K = C * cfg.n_sel
    warps = warps or default_score_warps(B, G, Ts, cs)
    kern = functools.partial(_score_kernel, h=h, r=r, mm=mm, cs=cs, mmp=next_pow2(mm),
                             n_sel=cfg.n_sel, n_init=cfg.n_init,
                             n_local=cfg.n_local, l_cmp=cfg.block_l, d_cmp=cfg.stride_d,
                             l_sel=cfg.sel_block, ts=Ts, spp=next_pow2(lse.shape[2]))
    return pl.pallas_call(
        kern, grid=(B, G, C),
        out_shape=[jax.ShapeDtypeStruct((B, G, K), jnp.float32),
                   jax.ShapeDtypeStruct((B, G, K), jnp.int32)],
        compiler_params=compiler_params(warps, 1), interpret=interpret, name="nsa_decode_score",
    )(t, s, lse)


def select_ids(t, s, lse, cfg, Ts, sel_chunk, merge_tile, interpret, score_warps=None):
    """Selected block ids [B,G,n_sel] from the compressed kernel's outputs, in value order (forced
    blocks first; -1 in unused slots): two launches, the chunk scores + chunk top-n over
    B x G x chunks programs (:func:`chunk_candidates`, ``score_warps`` warps each), then the
    merge over B x G x (candidates / merge_tile) programs."""
    vals, idx = chunk_candidates(t, s, lse, cfg, Ts, sel_chunk, interpret, score_warps)
    B, G, K = vals.shape
    kt = min(merge_tile, next_pow2(K))
    merge = functools.partial(_topn_merge_kernel, n_sel=cfg.n_sel, kt=kt)
    return pl.pallas_call(
        merge, grid=(B, G, cdiv(K, kt)),
        out_shape=jax.ShapeDtypeStruct((B, G, cfg.n_sel), jnp.int32),
        compiler_params=compiler_params(4, 1), interpret=interpret, name="nsa_decode_topn",
    )(vals, idx)
