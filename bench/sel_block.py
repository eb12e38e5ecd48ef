"""Selection kernels, query-major vs block-major (``KernelChoices.sel_fwd`` and ``sel_dq``), on
one GPU.

Per shape and T (bf16, B=1, selections from the Pallas scoring + top-n on random inputs): the
forward alone each way (and the block one's relative difference to the query one), the block ->
query index alone, the backward alone each way (query-major dQ + inverted dK/dV, or the fused
block-major dK/dV + dQ kernel; own index; relative differences of dq, dk, dv), a few block tile
variants of both, and the whole NSA op fwd+bwd with the gather selection kernels for each
(sel_fwd, sel_dq) pair (cmp_attn "auto"). One JSON line per row and a table.

    python bench/sel_block.py --shapes 125m bench --T 8192 65536 [--quick] [--out F]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import CFG, INTERP, SHAPES, make_inputs, timed  # noqa: E402

from nsa_jax.nsa import KernelChoices, nsa_attention, select_blocks  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402
from nsa_jax.pallas.selection import (inverted_index, item_tiles, sel_backward,  # noqa: E402
                                      sel_forward)
from nsa_jax.pallas.selection_block import sel_backward_block, sel_forward_block  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(shape, T, reps, variants):
    Hq, G, D = SHAPES[shape]
    a = make_inputs(0, T, Hq, G, D)
    scale = 1 / math.sqrt(D)
    idx = jax.jit(lambda q, kc: select_blocks(q, kc, CFG, impl="pallas"))(a[0], a[1])
    bs0 = BlockSizes.for_shape(Hq // G, D, 2)
    out = {"shape": shape, "T": T}
    qf = jax.jit(lambda q, k, v, i: sel_forward(q, k, v, i, CFG, bs0, scale, INTERP))
    out["query_fwd_ms"] = round(timed(qf, [(a[0], a[3], a[4], idx)], reps), 3)
    want = qf(a[0], a[3], a[4], idx)[0]
    n = idx.shape[-1]
    Ts = CFG.num_sel_blocks(T)
    for name, kw in variants:
        bs = dataclasses.replace(bs0, **kw)
        bf = jax.jit(lambda q, k, v, i, bs=bs: sel_forward_block(q, k, v, i, CFG, bs, scale,
                                                                 INTERP))
        out[f"block_fwd_ms[{name}]"] = round(timed(bf, [(a[0], a[3], a[4], idx)], reps), 3)
        out[f"block_rel_diff[{name}]"] = float(f"{rel(bf(a[0], a[3], a[4], idx)[0], want):.2e}")
    chunk = item_tiles(bs0, Hq // G)[1]
    ix = jax.jit(lambda i: inverted_index(i, T, Ts, chunk, CFG.sel_block, slots=True))
    out["index_ms"] = round(timed(ix, [(idx,)], reps), 3)
    del n
    # backward alone: the query forward's o / lse, a random bf16 cotangent, gates 1
    o, lse = want, qf(a[0], a[3], a[4], idx)[1]
    do = a[8][..., :a[4].shape[-1]].astype(a[0].dtype)
    bargs = [(a[0], a[3], a[4], idx, o, lse, do)]
    qb = jax.jit(lambda q, k, v, i, o, l, d: sel_backward(q, k, v, i, o, l, d, None, CFG, bs0,
                                                          scale, INTERP))
    out["query_bwd_ms"] = round(timed(qb, bargs, reps), 3)
    gw = qb(*bargs[0])
    for name, kw in variants:
        bs = dataclasses.replace(bs0, **kw)
        bb = jax.jit(lambda q, k, v, i, o, l, d, bs=bs: sel_backward_block(
            q, k, v, i, o, l, d, None, CFG, bs, scale, INTERP))
        out[f"block_bwd_ms[{name}]"] = round(timed(bb, bargs, reps), 3)
        out[f"block_bwd_rel_diff[{name}]"] = [float(f"{rel(x, y):.2e}")
                                              for x, y in zip(bb(*bargs[0]), gw)]
    for fwd, dq in (("query", "query"), ("block", "query"), ("block", "block")):
        ch = KernelChoices(sel_impl="gather", sel_fwd=fwd, sel_dq=dq)

        def fb(args, ct, ch=ch):
            o, vjp = jax.vjp(lambda *x: nsa_attention(*x, CFG, impl="pallas", choices=ch),
                             *args)
            return o, vjp(ct)
        out[f"nsa_fwd_bwd_ms[{fwd}/{dq}]"] = round(timed(jax.jit(fb), [(a[:8], a[8])], reps), 3)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["125m", "bench"], choices=sorted(SHAPES))
    p.add_argument("--T", type=int, nargs="+", default=[8192, 65536])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out")
    p.add_argument("--quick", action="store_true", help="the default block tiles only")
    p.add_argument("--variants", nargs="+", metavar="FIELD=V[,FIELD=V]",
                   help="BlockSizes variants of the block kernels (each besides the default), "
                        "e.g. sel_dq_rows=32 num_warps=8,sel_dq_rows=64")
    a = p.parse_args(argv)
    if a.variants:
        variants = [("default", {})] + [
            (v, {f: int(x) for f, x in (kv.split("=") for kv in v.split(","))})
            for v in a.variants]
    elif a.quick:
        variants = [("default", {})]
    else:
        variants = [("default", {}), ("chunk256", {"sel_chunk": 256}),
                    ("warps8", {"num_warps": 8}), ("rows64", {"sel_rows": 64}),
                    ("dq_rows128", {"sel_dq_rows": 128})]
    rows = []
    for shape in a.shapes:
        for T in a.T:
            r = run(shape, T, a.reps, variants)
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                           "jax": jax.__version__, "rows": rows}, indent=1))
    keys = [k for k in rows[0] if k not in ("shape", "T")]
    print("shape T " + " ".join(keys))
    for r in rows:
        print(r["shape"], r["T"], " ".join(str(r.get(k)) for k in keys))


if __name__ == "__main__":
    main()
