"""The block -> query index's sort, alone and in ``inverted_index``, at one shape (GPU).

    python3 bench/index_sort.py [--shape bench] [--T 65536] [--reps 30]

Times, on the selections of ``bench/kernels.py`` (our top-n on random inputs): ``inverted_index``
as the backward builds it, and ways to sort the B*G rows of T*n (key range, entry) pairs: batched
over the rows (XLA's own sort for a batch of rows) with one int32 key (range * T*n + entry: the
index before the sixteenth session), with a uint16 or an int32 range key carrying the entry; and
flat (one row of B*G*T*n, which XLA gives to CUB's radix sort) with a uint16 or uint32 (row,
range) key carrying the entry (``inverted_index`` now). Prints median ms, whether XLA kept a sort
of its own, and checks every order agrees with the first.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from harness import CFG, INTERP, SHAPES, make_inputs, timed  # noqa: E402
from nsa_jax.pallas import BlockSizes  # noqa: E402
from nsa_jax.pallas.compressed import cmp_forward  # noqa: E402
from nsa_jax.pallas.scoring import cmp_block_scores  # noqa: E402
from nsa_jax.pallas.selection import inverted_index, item_tiles, slot_keys  # noqa: E402
from nsa_jax.pallas.topn import topn_pallas  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="bench", choices=sorted(SHAPES))
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args(argv)
    Hq, G, D = SHAPES[a.shape]
    T = a.T
    bs = BlockSizes.for_shape(Hq // G, D)
    scale = 1.0 / math.sqrt(D)
    sets = [make_inputs(s, T, Hq, G, D) for s in (0, 1)]
    idxs = [topn_pallas(cmp_block_scores(x[0], x[1], cmp_forward(x[0], x[1], None, CFG, bs, scale,
                                                                 INTERP)[1], CFG, bs, scale,
                                         INTERP), CFG, INTERP) for x in sets]
    Ts = CFG.num_sel_blocks(T)
    _, chunk = item_tiles(bs, Hq // G)
    B, _, _, n = idxs[0].shape
    TN = T * n

    def rows(idx):
        jkey = slot_keys(idx, T, Ts, None, CFG.sel_block)
        jkey = jkey.transpose(0, 2, 1, 3).reshape(B * G, TN)
        return jkey, jnp.broadcast_to(jnp.arange(TN, dtype=jnp.int32), (B * G, TN))

    def one_key(idx):
        jkey, ent = rows(idx)
        ks = lax.sort(jkey * TN + ent, dimension=-1)
        return ks // TN, ks % TN

    def u16_pair(idx):
        jkey, ent = rows(idx)
        return lax.sort((jkey.astype(jnp.uint16), ent), dimension=-1, num_keys=1,
                        is_stable=True)

    def i32_pair(idx):
        jkey, ent = rows(idx)
        return lax.sort((jkey, ent), dimension=-1, num_keys=1, is_stable=True)

    def flat(kdt):
        def f(idx):
            jkey, ent = rows(idx)
            row0 = jnp.arange(B * G, dtype=jnp.int32)[:, None] * (Ts + 1)
            ks, e = lax.sort(((row0 + jkey).reshape(-1).astype(kdt), ent.reshape(-1)),
                             dimension=0, num_keys=1, is_stable=True)
            return ks.reshape(B * G, TN).astype(jnp.int32) - row0, e.reshape(B * G, TN)
        return f

    fns = {"inverted_index": lambda i: inverted_index(i, T, Ts, chunk, CFG.sel_block),
           "rows_one_int32_key": one_key, "rows_uint16_key_value": u16_pair,
           "rows_int32_key_value": i32_pair, "flat_uint16_key_value": flat(jnp.uint16),
           "flat_uint32_key_value": flat(jnp.uint32)}
    outs = {k: jax.jit(f)(idxs[0]) for k, f in fns.items() if k != "inverted_index"}
    ref_j, ref_e = outs["rows_one_int32_key"]
    for k in list(outs)[1:]:
        same = bool(jnp.all(outs[k][1] == ref_e)) and bool(
            jnp.all(outs[k][0].astype(jnp.int32) == ref_j))
        print(f"  {k}: same order as rows_one_int32_key: {same}")
    for k, f in fns.items():
        fj = jax.jit(f)
        n_sorts = fj.lower(idxs[0]).compile().as_text().count(" sort(")
        print(f"  {k:24s} {timed(fj, [(i,) for i in idxs], a.reps):8.3f} ms  "
              f"(XLA's own sorts in the HLO: {n_sorts})", flush=True)


if __name__ == "__main__":
    main()
