"""Selection kernels on selections that neighbouring queries share (GPU).

    PYTHONPATH=.:bench python3 bench/sel_locality.py [--shape bench] [--T 65536]
        [--shared 0 0.5 1] [--reps 10] [--out bench/results/sel_locality.json]

The kernel benchmarks give every query random blocks besides the forced ones (block 0, its own and
the previous block), the worst case for locality. A trained model's neighbouring queries pick
similar blocks. Here the queries of each tile of l' consecutive positions (one selection block)
share a pool of n - 3 blocks drawn at random from the tile's visible ones; each query takes the
first round(shared * (n - 3)) of them and draws the rest at random (distinct, visible, not forced):
``--shared 0`` is the benchmarks' random case, 1 a tile whose queries all select the same n
blocks. For each level it times, at one head shape of ``bench/kernels.py`` (B = 1, bf16), the
query-major selection forward, its backward with ``sel_dq`` "query" and "ds", and the tiled
(block-sparse flash attention) forward and backward, whose work grows with the union of a query
tile's blocks (printed; the tiled kernels are skipped where it exceeds ``--max-union`` blocks).
"""
from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import harness as K

from nsa_jax.nsa import KernelChoices
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.selection_tiled import sel_tiled_backward, sel_tiled_forward


def shared_selection(key, T: int, G: int, n: int, l_sel: int, shared: float):
    """int32 [1,T,G,n] block ids (-1 unused), distinct per (t, g): block 0, the query's own and
    previous block, then round(shared * (n - 3)) ids of its tile's pool and the rest random."""
    Ts = -(-T // l_sel)
    m = n - 3
    k_shared = int(round(shared * m))
    t = jnp.arange(T)
    cur = t // l_sel                                            # own block (= the tile's)
    j = jnp.arange(Ts)
    kp, kr = jax.random.split(key)
    W = max(Ts, m)                   # top_k's width: padding columns (-1) are never picked

    def pad(u):
        return jnp.pad(u, [(0, 0)] * (u.ndim - 1) + [(0, W - Ts)], constant_values=-1.0)
    # the pool of each (tile, group): m distinct blocks in [1, cur - 1)
    tiles = jnp.arange(Ts)
    ok_pool = (j[None, :] >= 1) & (j[None, :] < tiles[:, None] - 1)            # [Ts, Ts]
    up = jnp.where(ok_pool[:, None, :], jax.random.uniform(kp, (Ts, G, Ts)), -1.0)
    pv, pool = jax.lax.top_k(pad(up), m)                                             # [Ts, G, m]
    pool = jnp.where(pv >= 0, pool, -1)[cur][:, :, :k_shared]                  # [T, G, k]
    # the rest: random blocks in [1, cur - 1) not in the query's part of the pool
    ok = (j[None, None, :] >= 1) & (j[None, None, :] < cur[:, None, None] - 1)
    taken = jnp.zeros((T, G, Ts), bool).at[                                    # [T, G, Ts]
        t[:, None, None], jnp.arange(G)[None, :, None], pool].set(True, mode="drop")
    ur = jnp.where(ok & ~taken, jax.random.uniform(kr, (T, G, Ts)), -1.0)
    rv, rest = jax.lax.top_k(pad(ur), m - k_shared)
    rest = jnp.where(rv >= 0, rest, -1)
    forced = jnp.stack([jnp.zeros_like(cur), jnp.where(cur > 0, cur, -1),
                        jnp.where(cur > 1, cur - 1, -1)], axis=-1)             # [T, 3]
    forced = jnp.broadcast_to(forced[:, None, :], (T, G, 3))
    return jnp.concatenate([forced, pool, rest], axis=-1).astype(jnp.int32)[None]


def mean_union(idx, tile: int) -> float:
    """Mean number of distinct blocks over the queries of each tile and group."""
    _, T, G, n = idx.shape
    nt = T // tile
    x = idx[0, :nt * tile].reshape(nt, tile, G, n).transpose(0, 2, 1, 3).reshape(nt * G, -1)
    x = jnp.sort(x, axis=-1)
    distinct = (x[:, 1:] != x[:, :-1]) & (x[:, 1:] >= 0)
    return float(jnp.mean(jnp.sum(distinct, axis=-1) + (x[:, 0] >= 0)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="bench", choices=sorted(K.SHAPES))
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--shared", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--max-union", type=int, default=64)
    p.add_argument("--out")
    a = p.parse_args(argv)
    Hq, G, D, bs, scale, sets = K.setup(a.shape, a.T)
    cfg, interp = K.CFG, K.INTERP
    q_ch = KernelChoices(sel_impl="gather", sel_dq="query")
    ds_ch = KernelChoices(sel_impl="gather", sel_dq="ds")
    fns = {
        "gather_fwd": jax.jit(lambda q, k, v, i: sel_forward(q, k, v, i, cfg, bs, scale, interp)),
        "tiled_fwd": jax.jit(lambda q, k, v, i: sel_tiled_forward(q, k, v, i, cfg, bs, scale,
                                                                  interp)),
        "gather_bwd_query": jax.jit(lambda *x: sel_backward(*x, None, cfg, bs, scale, interp,
                                                             choices=q_ch)),
        "gather_bwd_ds": jax.jit(lambda *x: sel_backward(*x, None, cfg, bs, scale, interp,
                                                          choices=ds_ch)),
        "tiled_bwd": jax.jit(lambda *x: sel_tiled_backward(*x, None, cfg, bs, scale, interp)),
    }
    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shape": a.shape,
           "T": a.T, "points": []}
    for lvl in a.shared:
        idxs = [shared_selection(jax.random.PRNGKey(7 + s), a.T, G, cfg.n_sel, cfg.sel_block, lvl)
                for s in (0, 1)]
        union = mean_union(idxs[0], bs.sel_tile_q)
        pt = {"shared": lvl, "mean_union_per_tile": round(union, 2), "ms": {}}
        print(f"shared {lvl}: mean union of a {bs.sel_tile_q}-query tile's blocks {union:.1f}",
              flush=True)
        for impl in ("gather", "tiled"):
            if impl == "tiled" and union > a.max_union:
                print(f"  tiled skipped (union {union:.1f} > {a.max_union})", flush=True)
                continue
            fwd = fns[f"{impl}_fwd"]
            args = [(x[0], x[3], x[4], i) for x, i in zip(sets, idxs)]
            pt["ms"][f"{impl}_fwd"] = round(K.timed(fwd, args, a.reps), 3)
            fw = [fwd(*x) for x in args]
            bargs = [(x[0], x[3], x[4], i, o, lse, x[8]) for x, i, (o, lse) in zip(sets, idxs, fw)]
            for name in ([f"{impl}_bwd"] if impl == "tiled" else
                         ["gather_bwd_query", "gather_bwd_ds"]):
                pt["ms"][name] = round(K.timed(fns[name], bargs, a.reps), 3)
            del fw, bargs
            print("  " + ", ".join(f"{k} {v:.3f} ms" for k, v in pt["ms"].items()
                                   if k.startswith(impl)), flush=True)
        res["points"].append(pt)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
