"""Kernels on GPU streams of their own (``KernelChoices.streams``), timed against one stream.

    python3 bench/streams.py --out $OUT/streams.json [--shapes bench 125m]
        [--T 65536] [--reps 20] [--modes off sel all]

For each (shape, T), in one process, with the inputs and selections of ``bench/kernels.py``:
the gather selection backward (``sel_backward``: dQ kernel, index, inverted dK/dV) under each
mode, the whole ``nsa_attention(impl="pallas")`` fwd+bwd under each mode, and cuDNN dense causal
fwd+bwd as the yardstick. Modes are timed in the order given, then again in reverse (first /
last in the JSON), so a drift of the GPU shows as a spread. Each mode's outputs are compared
with "off" (relative RMS over all gradients; the dK/dV atomics add in another order, so the
difference is float rounding, not zero). The compiled HLO's async calls on streams are counted
(``call-start`` with a ``_xla_stream_annotation``), to show the annotation reached XLA.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kernels import CFG, INTERP, SHAPES, make_inputs, timed  # noqa: E402
from nsa_jax.nsa import KernelChoices, nsa_attention
from nsa_jax.pallas import BlockSizes
from nsa_jax.pallas.compressed import cmp_forward
from nsa_jax.pallas.scoring import cmp_block_scores
from nsa_jax.pallas.selection import sel_backward, sel_forward
from nsa_jax.pallas.topn import topn_pallas


def rel(xs, ys):
    num = sum(float(jnp.sum((jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32)) ** 2))
              for x, y in zip(xs, ys))
    den = sum(float(jnp.sum(jnp.asarray(y, jnp.float32) ** 2)) for y in ys)
    return math.sqrt(num / max(den, 1e-30))


def stream_calls(fn, args) -> int:
    text = fn.lower(*args).compile().as_text()
    return len(re.findall(r"call-start[^\n]*_xla_stream_annotation", text))


def bench(shape, T, modes, reps, log):
    Hq, G, D = SHAPES[shape]
    bs = BlockSizes.for_shape(Hq // G, D)
    scale = 1.0 / math.sqrt(D)
    sets = [make_inputs(s, T, Hq, G, D) for s in (0, 1)]
    idxs = [topn_pallas(cmp_block_scores(a[0], a[1], cmp_forward(a[0], a[1], None, CFG, bs, scale,
                                                                 INTERP)[1], CFG, bs, scale,
                                         INTERP), CFG, INTERP) for a in sets]
    fw = [sel_forward(a[0], a[3], a[4], i, CFG, bs, scale, INTERP) for a, i in zip(sets, idxs)]
    res, checks, calls = {}, {}, {}
    order = list(modes) + list(reversed(modes))

    def sel_b(mode):
        ch = KernelChoices(streams=mode)
        return jax.jit(lambda q, k, v, i, o, lse, do, gs: sel_backward(
            q, k, v, i, o, lse, do, gs, CFG, bs, scale, INTERP, choices=ch))
    sel_args = [(a[0], a[3], a[4], i, o, lse, a[8], a[7][..., 1])
                for a, i, (o, lse) in zip(sets, idxs, fw)]

    def op(mode):
        ch = KernelChoices(streams=mode)

        def loss(*a):
            return jnp.sum(nsa_attention(*a[:8], CFG, impl="pallas", choices=ch)
                           .astype(jnp.float32) * a[8].astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=tuple(range(8))))

    for name, make, argsets in (("sel_bwd", sel_b, sel_args), ("nsa_fwd_bwd", op, sets)):
        fns = {m: make(m) for m in modes}
        base = fns["off"](*argsets[0]) if "off" in fns else None
        for m in modes:
            calls[f"{name}_{m}"] = stream_calls(fns[m], argsets[0])
            if base is not None and m != "off":
                checks[f"{name}_{m}"] = rel(jax.tree.leaves(fns[m](*argsets[0])),
                                            jax.tree.leaves(base))
        for i, m in enumerate(order):
            key = f"{name}_{m}" + ("_first" if i < len(modes) else "_last")
            res[key] = round(timed(fns[m], argsets, reps), 4)
            log(f"  {key:28s} {res[key]:10.3f} ms  (stream calls {calls[f'{name}_{m}']})")
        del fns, base

    def dense_loss(q, k, v, c):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))
    res["dense_fwd_bwd"] = round(timed(jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2))),
                                       [(a[0], a[3], a[4], a[8]) for a in sets], reps), 4)
    log(f"  {'dense_fwd_bwd':28s} {res['dense_fwd_bwd']:10.3f} ms")
    log(f"  rel. RMS vs 'off': {checks}")
    return {"shape": shape, "T": T, "ms": res, "rel_vs_off": checks, "stream_calls": calls,
            "block_sizes": dataclasses.asdict(bs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["bench"], choices=sorted(SHAPES))
    p.add_argument("--T", type=int, nargs="+", default=[65536])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--modes", nargs="+", default=["off", "sel", "all"],
                   choices=["off", "sel", "all"])
    a = p.parse_args(argv)
    if jax.default_backend() != "gpu":
        sys.exit("bench/streams.py: needs a GPU")
    log = lambda s: print(s, flush=True)
    doc = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
           "python": platform.python_version(), "B": 1, "dtype": "bfloat16",
           "nsa": dataclasses.asdict(CFG), "reps": a.reps,
           "stat": "median wall ms, block_until_ready", "results": []}
    for shape in a.shapes:
        for T in a.T:
            log(f"== {shape} T={T}")
            doc["results"].append(bench(shape, T, a.modes, a.reps, log))
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
    print("\n| shape | T | mode | sel bwd (first / last) | NSA fwd+bwd (first / last) | dense "
          "fwd+bwd | dense / NSA |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in doc["results"]:
        ms = r["ms"]
        for m in a.modes:
            nsa = ms[f"nsa_fwd_bwd_{m}_first"], ms[f"nsa_fwd_bwd_{m}_last"]
            print(f"| {r['shape']} | {r['T']} | {m} | {ms[f'sel_bwd_{m}_first']:.2f} / "
                  f"{ms[f'sel_bwd_{m}_last']:.2f} | {nsa[0]:.2f} / {nsa[1]:.2f} | "
                  f"{ms['dense_fwd_bwd']:.2f} | {ms['dense_fwd_bwd'] / min(nsa):.2f}x |")


if __name__ == "__main__":
    main()
