"""The selection backward under several ``KernelChoices.sel_dq`` values in one process (GPU).

    PYTHONPATH=.:bench python3 bench/sel_dq_ab.py [--shape bench] [--T 65536] [--modes query ds]
        [--rounds 2] [--reps 20] [--op] [--out bench/results/sel_dq_ab.json]

A mode is "query" or "ds" (the ``sel_dq`` values ``selection.sel_backward`` takes), optionally
with ``BlockSizes`` fields: ``ds:num_stages=3,sel_stages=2``.

At one head shape of ``bench/kernels.py`` (B = 1, bf16, its NSA config) and block ids from the
kernels' own scoring + top-n on random inputs, it times ``selection.sel_backward`` (index, dQ and
dK/dV) with each mode, ``--rounds`` times in alternating order (median of ``--reps`` calls over two
input sets, ``kernels.timed``), and reports the relative RMS difference of each mode's dq, dk, dv
from the first mode's (both bf16 runs of the same math: differences are rounding, ~1e-3). With
``--op`` also the whole op's fwd+bwd (``nsa_attention(impl="pallas")``) per mode.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import harness as K

from nsa_jax.nsa import KernelChoices, nsa_attention
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.compressed import cmp_forward
from nsa_jax.pallas.scoring import cmp_block_scores
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.topn import topn_pallas


def rrmse(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.sqrt(jnp.mean((a - b) ** 2) / jnp.maximum(jnp.mean(b ** 2), 1e-30)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="bench", choices=sorted(K.SHAPES))
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--modes", nargs="+", default=["query", "ds"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--op", action="store_true", help="also time the whole op fwd+bwd per mode")
    p.add_argument("--out")
    a = p.parse_args(argv)
    for mode in a.modes:              # before any compute
        if mode.partition(":")[0] not in ("query", "ds"):
            raise SystemExit(f"bench/sel_dq_ab.py: --modes takes 'query' or 'ds' (with ':' and "
                             f"BlockSizes fields), got {mode!r}")
    Hq, G, D, bs, scale, sets = K.setup(a.shape, a.T)
    cfg, interp = K.CFG, K.INTERP
    select = jax.jit(lambda q, kc: topn_pallas(cmp_block_scores(
        q, kc, cmp_forward(q, kc, None, cfg, bs, scale, interp)[1], cfg, bs, scale, interp),
        cfg, interp))
    idxs = [select(x[0], x[1]) for x in sets]
    fw = [jax.jit(lambda q, k, v, i: sel_forward(q, k, v, i, cfg, bs, scale, interp))(
        x[0], x[3], x[4], i) for x, i in zip(sets, idxs)]
    argsets = [(x[0], x[3], x[4], i, o, lse, x[8], x[7][..., 1])
               for x, i, (o, lse) in zip(sets, idxs, fw)]

    def parse(mode):
        """"ds:num_stages=3" -> (KernelChoices with sel_dq "ds", BlockSizes with the fields)."""
        name, _, spec = mode.partition(":")
        tiles = K.fields([x for x in spec.split(",") if x], BlockSizes)
        return (KernelChoices(sel_impl="gather", sel_dq=name),
                dataclasses.replace(bs, **tiles))

    fns = {m: jax.jit(lambda *args, cb=parse(m): sel_backward(
        *args, cfg, cb[1], scale, interp, choices=cb[0])) for m in a.modes}
    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shape": a.shape,
           "T": a.T, "modes": a.modes, "sel_bwd_ms": {m: [] for m in a.modes}, "rrmse": {}}
    want = fns[a.modes[0]](*argsets[0])
    for m in a.modes[1:]:
        got = fns[m](*argsets[0])
        res["rrmse"][m] = {n: rrmse(x, y) for n, x, y in zip(("dq", "dk", "dv"), got, want)}
        print(f"{m} vs {a.modes[0]}: rrmse " + ", ".join(
            f"{n} {v:.2e}" for n, v in res["rrmse"][m].items()), flush=True)
    del want
    for r in range(a.rounds):
        for m in (a.modes if r % 2 == 0 else a.modes[::-1]):
            ms = K.timed(fns[m], argsets, a.reps)
            res["sel_bwd_ms"][m].append(round(ms, 3))
            print(f"sel_bwd {m:24s} round {r}: {ms:8.3f} ms", flush=True)
    if a.op:
        res["op_ms"] = {}
        for m in a.modes:
            ch, bm = parse(m)

            def loss(*x, ch=ch, bm=bm):
                return jnp.sum(nsa_attention(*x[:8], cfg, impl="pallas", choices=ch,
                                             block_sizes=bm)
                               .astype(jnp.float32) * x[8].astype(jnp.float32))
            f = jax.jit(jax.grad(loss, argnums=tuple(range(8))))
            res["op_ms"][m] = round(K.timed(f, sets, a.reps), 3)
            print(f"op fwd+bwd {m:24s}: {res['op_ms'][m]:8.3f} ms", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
