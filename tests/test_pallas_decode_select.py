"""The Pallas decode kernels' block selection (scores, chunk top-n by rank, merge) against the
jax.numpy decode path, with many exactly tied block scores (interpret mode, float32)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.decoding import nsa_decode_attention
from nsa_testutil import rel_err


def _sorted_ids(ids):
    """Score-ordered ids (-1 in unused slots) -> ascending ids, -1 last (the jnp path's order)."""
    ids = np.asarray(ids)
    big = np.where(ids < 0, np.iinfo(np.int32).max, ids)
    return np.where(np.sort(big, axis=-1) == np.iinfo(np.int32).max, -1, np.sort(big, axis=-1))


def _random_caches(keys, cfg, B, G, D, S):
    """N(0, 1) decode caches of S tokens (their compressed blocks, the window ring) from 6 keys."""
    Tc = cfg.num_cmp_blocks(S)
    shapes = {"k_cmp": Tc, "v_cmp": Tc, "k_slc": S, "v_slc": S, "k_win": cfg.window,
              "v_win": cfg.window}
    return {k: jax.random.normal(keys[i], (B, G, n, D)) for i, (k, n) in enumerate(shapes.items())}


def _random_case(seed, cfg, B, G, h, D, S):
    """-> (caches, sigmoid gates [B, G*h, 3], a key for the queries), all from PRNGKey(seed)."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    gates = jax.nn.sigmoid(jax.random.normal(ks[6], (B, G * h, 3)))
    return _random_caches(ks[:6], cfg, B, G, D, S), gates, ks[7]


@pytest.mark.parametrize("merge_tile", [4, 64])
def test_decode_selection_with_tied_scores_matches_jnp(merge_tile):
    """Identical compressed keys make every fully visible selection block score the same, so
    the top-n is decided by the tie rule (lower block index first) across scoring chunks of 4
    blocks and merge slices of ``merge_tile`` candidates; the ids and the output must equal the
    jax.numpy decode path's for rows at different positions."""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1,
                    n_local=2)
    B, G, h, D, S = 2, 2, 3, 16, 208
    Tc = cfg.num_cmp_blocks(S)
    ks = jax.random.split(jax.random.PRNGKey(3), 8)
    one_key = jax.random.normal(ks[0], (B, G, 1, D))
    kv = {"k_cmp": jnp.broadcast_to(one_key, (B, G, Tc, D)),
          "v_cmp": jax.random.normal(ks[1], (B, G, Tc, D)),
          "k_slc": jax.random.normal(ks[2], (B, G, S, D)),
          "v_slc": jax.random.normal(ks[3], (B, G, S, D)),
          "k_win": jax.random.normal(ks[4], (B, G, cfg.window, D)),
          "v_win": jax.random.normal(ks[5], (B, G, cfg.window, D))}
    gates = jax.nn.sigmoid(jax.random.normal(ks[6], (B, G * h, 3)))
    want_f = jax.jit(lambda q, t: nsa_decode_attention(q, kv, t, gates, cfg, return_info=True))
    got_f = jax.jit(lambda q, t: nsa_decode_pallas(q, kv, t, gates, cfg, cmp_keys=16, splits=3,
                                                   sel_chunk=4, merge_tile=merge_tile,
                                                   return_ids=True))
    for i, t0 in enumerate(range(90, S, 13)):
        t = jnp.asarray([t0, t0 - 37], jnp.int32)
        q = 2.0 * jax.random.normal(jax.random.fold_in(ks[7], i), (B, G * h, D))
        want, info = want_f(q, t)
        got, ids = got_f(q, t)
        np.testing.assert_array_equal(_sorted_ids(ids), np.asarray(info["ids"]),
                                      err_msg=f"t={t0}")
        assert rel_err(got, want) <= 2e-5, (t0, rel_err(got, want))


def test_decode_ids_with_fewer_candidates_than_n():
    """Rows where fewer than n blocks exist (t < (n - 1) l'): ``return_ids`` holds the candidate
    blocks first and -1 in each unused slot, the ids and the output equal the jax.numpy decode
    path's; scoring chunks of 8 blocks (the second all padding) and merge slices of 4
    candidates. (An unused slot holding Ts, or left unwritten, passed every other test: the
    selected-block kernel reads no block that starts past t.)"""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=6, window=16, n_init=1,
                    n_local=2)
    B, G, h, D, S = 2, 2, 3, 16, 256
    kv, gates, qkey = _random_case(6, cfg, B, G, h, D, S)
    want_f = jax.jit(lambda q, t: nsa_decode_attention(q, kv, t, gates, cfg, return_info=True))
    got_f = jax.jit(lambda q, t: nsa_decode_pallas(q, kv, t, gates, cfg, cmp_keys=16, splits=2,
                                                   sel_chunk=4, merge_tile=4, return_ids=True))
    for i, t0 in enumerate([0, 17, 40, 79]):
        t = jnp.asarray([t0, t0 // 2], jnp.int32)
        q = 2.0 * jax.random.normal(jax.random.fold_in(qkey, i), (B, G * h, D))
        want, info = want_f(q, t)
        got, ids = got_f(q, t)
        ids = np.asarray(ids)
        for bb, n_cand in enumerate(np.asarray(t) // cfg.sel_block + 1):
            assert n_cand < cfg.n_sel
            assert (ids[bb, :, :n_cand] >= 0).all() and (ids[bb, :, n_cand:] == -1).all(), (
                t0, bb, ids[bb])
        np.testing.assert_array_equal(_sorted_ids(ids), np.asarray(info["ids"]),
                                      err_msg=f"t={t0}")
        assert rel_err(got, want) <= 2e-5, (t0, rel_err(got, want))


def test_cmp_splits_rule():
    """The compressed decode kernel's key splits (``decode._splits``, 125M shape: G=2, 64-key
    tiles): one tile per program up to 1280 (row, group, tile) units, capped at 128 splits;
    above, about 2048 programs of at most 32 splits (the measured settings, bench/NOTES.md),
    also for the decoder's padded caches (``decode.cache_sizes``)."""
    from nsa_jax.decode import cache_sizes
    from nsa_jax.pallas.decode import _splits
    tc = {8: 512, 64: 4096, 128: 8192, 256: 16384}           # context (k tokens) -> Tc at d=16
    assert _splits(1, 2, tc[128], 64) == 128                 # 256 units: a program per tile
    assert _splits(8, 2, tc[64], 64) == 64                   # 1024 units: still one tile each
    assert _splits(8, 2, tc[8], 64) == 8
    assert _splits(1, 2, tc[256], 64) == 128                 # capped: two tiles per program
    assert _splits(8, 2, tc[128], 64) == 32                  # 2048 units: 4 tiles per program
    assert _splits(64, 2, tc[128], 64) == 16                 # 2048 programs of 8 tiles
    assert _splits(1, 1, 1, 64) == 1
    cfg = NSAConfig()
    for ctx, B, want in [(65536, 8, 68), (131072, 1, 128), (131072, 8, 32), (8192, 8, 12)]:
        padded = cache_sizes(cfg, ctx + 200)["cmp"]          # a few tokens past the context
        assert _splits(B, 2, padded, 64) == want, (ctx, B, padded)


@pytest.mark.parametrize("cmp_keys,splits", [(16, 128), (8, 100), (4, 128)])
def test_decode_many_splits_matches_jnp(cmp_keys, splits):
    """More than 32 compressed splits, as ``decode._splits`` now gives: 33 tiles over 128
    splits (most programs see no key), 65 over 100 (merged as 128 padded partial states), 130
    over 128 (two tiles in some programs); rows at different positions, some before the first
    compressed block. Float32, interpret mode: the jax.numpy decode path to 2e-5."""
    from nsa_jax.pallas.decode import nsa_decode_pallas
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16, n_init=1,
                    n_local=2)
    B, G, h, D, S = 2, 1, 3, 16, 2080
    kv, gates, qkey = _random_case(5, cfg, B, G, h, D, S)
    want_f = jax.jit(lambda q, t: nsa_decode_attention(q, kv, t, gates, cfg))
    got_f = jax.jit(lambda q, t: nsa_decode_pallas(q, kv, t, gates, cfg, cmp_keys=cmp_keys,
                                                   splits=splits, sel_chunk=32))
    for i, t0 in enumerate([S - 1, 1500, 40, 3]):
        t = jnp.asarray([t0, max(0, t0 - 37)], jnp.int32)
        q = 2.0 * jax.random.normal(jax.random.fold_in(qkey, i), (B, G * h, D))
        assert rel_err(got_f(q, t), want_f(q, t)) <= 2e-5, t0


def test_decode_cmp_warps_is_checked():
    from nsa_jax.pallas.decode import nsa_decode_pallas
    with pytest.raises(ValueError, match="cmp_warps"):
        nsa_decode_pallas(jnp.zeros((1, 2, 16)), {}, 0, None, NSAConfig(), cmp_warps=3)


@pytest.mark.parametrize("l,d,lp,bk,splits", [(8, 4, 16, 16, 3), (8, 4, 16, 4, 5),
                                              (16, 4, 24, 16, 2), (4, 4, 8, 16, 1),
                                              (32, 16, 64, 16, 2)])
def test_decode_block_scores_equal_eq9_eq10(l, d, lp, bk, splits):
    """The scoring kernel's chunk values from the compressed kernel's logits and per-split lse
    are Eq. 9-10 computed from the softmax of the visible compressed logits (float32, interpret
    mode, to 1e-5 relative): tails of r - 1 = 0, 1 and 3 entries, mm = 2, 4 and 6 entries per
    block, logits from several splits, rows where the last block is only partly visible; forced
    blocks +inf, non-candidates absent. (The model-level parity tests did not notice a tail
    weighted by half: bench/NOTES.md, twenty-eighth session.)"""
    _check_chunk_scores(NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=16, window=16,
                                  n_init=1, n_local=2), bk, splits)


@pytest.mark.parametrize("l,d,lp,bk,splits", [(8, 4, 16, 16, 3), (16, 4, 24, 16, 2)])
def test_decode_block_scores_without_forced_blocks(l, d, lp, bk, splits):
    """As test_decode_block_scores_equal_eq9_eq10 with n_init = n_local = 0 (valid settings, and
    the only ones where two masks of the scoring kernel matter): block 0, whose tail would start
    before logit 0, and the current block, whose tail and own row reach past the visible logits
    at its first l - d tokens, are candidates scored by Eq. 9-10, not forced to +inf. (Dropping
    the tail's ``>= 0`` or ``< nvis`` mask passed every test while both blocks were forced.)"""
    _check_chunk_scores(NSAConfig(block_l=l, stride_d=d, sel_block=lp, n_sel=16, window=16,
                                  n_init=0, n_local=0), bk, splits)


def _check_chunk_scores(cfg, bk, splits):
    """The chunk values of ``decode_select.chunk_candidates`` for Ts = 12 selection blocks (one
    chunk) == Eq. 9-10 from the visible compressed logits, forced blocks +inf, non-candidates
    absent; rows at two positions, several of them in the first l - d tokens of a block."""
    from nsa_jax.nsa.semantics import block_scores, selection_masks
    from nsa_jax.pallas.decode import _cmp_call
    from nsa_jax.pallas.decode_select import chunk_candidates
    l, d, lp = cfg.block_l, cfg.stride_d, cfg.sel_block
    B, G, h, D = 2, 2, 3, 16
    Ts = 12                                     # all candidates fit one chunk's 16 slots
    S = Ts * lp
    Tc = cfg.num_cmp_blocks(S)
    ks = jax.random.split(jax.random.PRNGKey(11), 4)
    k = jax.random.normal(ks[0], (B, G, Tc, D))
    v = jax.random.normal(ks[1], (B, G, Tc, D))
    scale = 1.0 / np.sqrt(D)
    for i, t0 in enumerate([S - 1, S // 2 + 5, 3 * lp - 1, lp + l]):
        t = jnp.asarray([t0, max(0, t0 - 2 * lp - 3)], jnp.int32)
        q = 2.0 * jax.random.normal(jax.random.fold_in(ks[2], i), (B, G, h, D))
        s_cmp, _, _, _, lse = _cmp_call(t, q, k, v, cfg, splits, bk, scale, True)
        vals, idx = chunk_candidates(t, s_cmp, lse, cfg, Ts, Ts, True)
        s = jnp.einsum("bghd,bgcd->bghc", q, k) * scale
        nvis = jnp.clip((t - l + 1) // d + 1, 0, Tc)
        s = jnp.where(jnp.arange(Tc) < nvis[:, None, None, None], s, -jnp.inf)
        p = jnp.where(nvis[:, None, None, None] > 0, jax.nn.softmax(s, axis=-1), 0.0)
        want = np.asarray(block_scores(p, Ts, cfg).sum(axis=2))          # [B, G, Ts]
        cand, forced = (np.asarray(x) for x in selection_masks(t, Ts, cfg))
        vals, idx = np.asarray(vals), np.asarray(idx)
        for bb in range(B):
            for gg in range(G):
                got = dict(zip(idx[bb, gg].tolist(), vals[bb, gg].tolist()))
                for j in range(Ts):
                    if not cand[bb, j]:
                        assert j not in got, (t0, bb, j)
                        continue
                    assert j in got, (t0, bb, j)          # every candidate: Ts <= n_sel
                    if forced[bb, j]:
                        assert got[j] == np.inf, (t0, bb, j)
                    else:
                        np.testing.assert_allclose(got[j], want[bb, gg, j], rtol=1e-5,
                                                   atol=1e-7, err_msg=f"t={t0} b={bb} j={j}")
