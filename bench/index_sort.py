"""The block -> query index's sort, alone and in ``inverted_index``, at one shape (GPU).

    python3 bench/index_sort.py [--shape bench] [--T 65536] [--reps 30]

Times, on the selections of ``bench/kernels.py`` (our top-n on random inputs): ``inverted_index``
as the backward builds it, and three ways to sort the B*G rows of T*n (key range, entry) pairs:
one int32 key (range * T*n + entry; what ``inverted_index`` does when it fits), the range as a
uint16 key carrying the entry as a value (a stable two-operand sort), and the range as an int32
key carrying the entry. Prints median ms; checks the three orders agree.
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

from kernels import CFG, INTERP, SHAPES, make_inputs, timed  # noqa: E402
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
        jkey = slot_keys(idx, T, Ts).transpose(0, 2, 1, 3).reshape(B * G, TN)
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

    fns = {"inverted_index": lambda i: inverted_index(i, T, Ts, chunk, CFG.sel_block),
           "sort_one_int32_key": one_key, "sort_uint16_key_value": u16_pair,
           "sort_int32_key_value": i32_pair}
    outs = {k: jax.jit(f)(idxs[0]) for k, f in fns.items() if k != "inverted_index"}
    ref_e = outs["sort_one_int32_key"][1]
    for k in ("sort_uint16_key_value", "sort_int32_key_value"):
        same = bool(jnp.all(outs[k][1] == ref_e)) and bool(
            jnp.all(outs[k][0].astype(jnp.int32) == outs["sort_one_int32_key"][0]))
        print(f"  {k}: same order as the one-key sort: {same}")
    for k, f in fns.items():
        fj = jax.jit(f)
        n_sorts = fj.lower(idxs[0]).compile().as_text().count(" sort(")
        print(f"  {k:24s} {timed(fj, [(i,) for i in idxs], a.reps):8.3f} ms  "
              f"(XLA sort ops left in the HLO: {n_sorts})", flush=True)


if __name__ == "__main__":
    main()
