"""NSA and dense attention of one new token per batch row over KV caches (pure jax.numpy).

The decoding twin of :mod:`nsa_jax.nsa.reference`: the same rules from
:mod:`nsa_jax.nsa.semantics` applied to the query at position ``t[b]`` of each row b (rows may be
at different positions). The Pallas decode kernels (:mod:`nsa_jax.pallas.decode`) are tested
against these functions.

Cache layout per NSA layer (``[B, G, S, D]``: the sequence axis next to D so selection blocks are a
free reshape); every array is optional, present only for the enabled branches:

* ``k_slc, v_slc`` [B,G,Ts*l',D]: RoPE-rotated selection-branch keys/values of every token;
* ``k_win, v_win`` [B,G,W,D]: ring buffer of the last ``W`` window-branch keys/values (position
  s in slot ``s % W``);
* ``k_cmp, v_cmp`` [B,G,Tc_max,D]: compressed keys/values (Eq. 7); block i is written when its
  last token ``i*d + l - 1`` arrives;
* ``kc_raw, vc_raw`` [B,G,l,D]: ring buffer of the last l un-rotated cmp-branch keys/values, the
  inputs of the next block's φ;
* ``sync`` int32 [B,G,SYNC_SLOTS]: completion counters of the Pallas decode kernels (the program
  that completes a unit of work finishes it and sets its counter back to 0, so all are 0 between
  steps; :mod:`nsa_jax.pallas.phi_decode`); the jax.numpy path ignores it.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.nsa import semantics
from nsa_jax.nsa.config import NSAConfig


SYNC_SLOTS = 2   # counters per (row, group) in the ``sync`` cache
SYNC_PHI = 0     # + c: φ's branch c (K, V) per row tile (``pallas.phi_decode``)


def ring_positions(t, R: int):
    """Position held by each slot of a ring buffer of R slots after the write of position t:
    t [B] -> [B, R] (negative where the slot was never written)."""
    t = jnp.asarray(t)[..., None]
    return t - jnp.mod(t - jnp.arange(R), R)


def write_rows(buf, x, idx):
    """buf [B,G,S,D] <- x [B,G,D] at sequence index idx[b] (< S) per row.

    One row is a dynamic-update-slice and several rows a scatter; XLA updates a donated buffer in
    place for both."""
    B = buf.shape[0]
    x = x.astype(buf.dtype)
    if B == 1:
        return jax.lax.dynamic_update_slice(buf, x[:, :, None], (0, 0, idx[0], 0))
    return buf.at[jnp.arange(B), :, idx].set(x, mode="promise_in_bounds")


def gather_rows(x, pos):
    """x [B,G,P,D], pos [B,R] (clipped to [0, P)) -> [B,G,R,D]."""
    idx = jnp.clip(pos, 0, x.shape[2] - 1)[:, None, :, None]
    return jnp.take_along_axis(x, idx, axis=2)


def _scores(qg, k):
    """q . k with float32 accumulation, reading the cache in its own dtype (no float32 copy)."""
    return jnp.einsum("bghd,bgsd->bghs", qg.astype(k.dtype), k,
                      preferred_element_type=jnp.float32)


def _mix(p, v):
    """p [B,G,h,S] (float32) @ v [B,G,S,Dv] -> float32. Exact float32 for float32 caches; for
    bfloat16 caches p is rounded to bfloat16 like the flash kernels do (accumulation float32)."""
    return jnp.einsum("bghs,bgsd->bghd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)


def _attend(qg, k, v, mask):
    """qg [B,G,h,D], k [B,G,S,D], v [B,G,S,Dv], mask broadcastable to [B,G,h,S] -> f32."""
    scale = 1.0 / math.sqrt(qg.shape[-1])
    return _mix(semantics.masked_softmax(_scores(qg, k) * scale, mask), v)


def select_from_probs(p_cmp, t, cfg: NSAConfig, Ts: int):
    """Selected blocks (Eq. 9-11) of the queries at t from their compressed probabilities:
    p_cmp [B,G,h,Tc] float32, t [B] -> int32 [B,G,n_sel] (ascending, -1 for unused slots)."""
    scores = semantics.block_scores(p_cmp, Ts, cfg).sum(axis=2)               # Eq. 10
    return semantics.topn_from_scores(jax.lax.stop_gradient(scores), t[:, None], cfg)


def nsa_decode_attention(q, lc: dict, t, gates, cfg: NSAConfig, return_info: bool = False):
    """NSA attention (Eq. 5) of the query at position t[b] over caches holding tokens 0..t[b].

    q [B,Hq,Dk]; gates [B,Hq,3]; t int32 [B] (or a scalar, broadcast). -> [B,Hq,Dv] in q.dtype.
    With ``return_info`` also a dict with the selected block ids [B,G,n] and the number of keys
    each branch attended to (batch row 0, group 0), for tests and counters.
    """
    B, Hq, Dk = q.shape
    t = jnp.broadcast_to(jnp.asarray(t, jnp.int32), (B,))
    br = cfg.branches
    G = next(lc[k] for k in ("k_cmp", "k_slc", "k_win") if k in lc).shape[1]
    h = Hq // G
    qg = q.reshape(B, G, h, Dk)
    info = {}
    o_cmp = o_slc = o_win = None

    lp = cfg.sel_block
    if "cmp" in br or "slc" in br:
        k_cmp = lc["k_cmp"]
        vis = semantics.cmp_visible(t, k_cmp.shape[2], cfg)[:, None, None, :]   # [B,1,1,Tc]
        p_cmp = semantics.masked_softmax(_scores(qg, k_cmp) / math.sqrt(Dk), vis)  # Eq. 8
        info["cmp"] = jnp.sum(vis[0])
        if "cmp" in br:
            o_cmp = _mix(p_cmp, lc["v_cmp"])

    if "slc" in br:
        k_slc, v_slc = lc["k_slc"], lc["v_slc"]
        Ts = k_slc.shape[2] // lp
        ids = select_from_probs(p_cmp, t, cfg, Ts)
        safe = jnp.maximum(ids, 0)[..., None, None]
        kb = jnp.take_along_axis(k_slc.reshape(B, G, Ts, lp, -1), safe, axis=2)  # [B,G,n,l',D]
        vb = jnp.take_along_axis(v_slc.reshape(B, G, Ts, lp, -1), safe, axis=2)
        n = ids.shape[-1]
        tok = ids[..., None] * lp + jnp.arange(lp)                               # [B,G,n,l']
        valid = (ids[..., None] >= 0) & (tok <= t[:, None, None, None])
        o_slc = _attend(qg, kb.reshape(B, G, n * lp, -1), vb.reshape(B, G, n * lp, -1),
                        valid.reshape(B, G, 1, n * lp))
        info["slc"] = jnp.sum(valid[0, 0])
        info["ids"] = ids

    if "win" in br:
        W = lc["k_win"].shape[2]
        pos = ring_positions(t, W)                                               # [B,W]
        valid = (pos >= 0) & semantics.window_visible(t[:, None], pos, cfg.window)
        o_win = _attend(qg, lc["k_win"], lc["v_win"], valid[:, None, None, :])
        info["win"] = jnp.sum(valid[0])

    def flat(o):
        return None if o is None else o.reshape(B, Hq, -1)

    out = semantics.combine(flat(o_cmp), flat(o_slc), flat(o_win), gates, cfg, q.dtype)
    return (out, info) if return_info else out


def dense_decode_attention(q, k, v, t):
    """Causal attention of the query at position t[b]: q [B,Hq,D], caches [B,G,S,D] -> [B,Hq,D]."""
    B, Hq, D = q.shape
    G = k.shape[1]
    t = jnp.broadcast_to(jnp.asarray(t, jnp.int32), (B,))
    valid = (jnp.arange(k.shape[2]) <= t[:, None])[:, None, None, :]
    o = _attend(q.reshape(B, G, Hq // G, D), k, v, valid)
    return o.reshape(B, Hq, -1).astype(q.dtype)
