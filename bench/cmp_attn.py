"""Compressed attention through the Pallas kernels vs a grouped causal cuDNN attention
(``KernelChoices.cmp_attn``, issue #15), in one process on one GPU, bf16, B=1.

For each (shape, T): the compressed branch alone (output + the lse the selection scores need,
forward and forward+backward) for ``pallas`` and ``cudnn``, then the whole NSA op fwd+bwd with
each choice, and cuDNN dense causal attention fwd+bwd as the yardstick. Prints one JSON line per
timing and a table last; ``--out`` writes the JSON.

    PYTHONPATH=. python bench/cmp_attn.py --shapes bench 125m --T 16384 65536 [--out F]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import CFG, SHAPES, make_inputs, timed  # noqa: E402

from nsa_jax.nsa import KernelChoices, nsa_attention  # noqa: E402
from nsa_jax.pallas.cmp_grouped import cmp_attention_grouped  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402
from nsa_jax.pallas.compressed import cmp_attention  # noqa: E402


def branch(impl: str, Hq: int, G: int, D: int):
    """(o, lse) of the compressed branch by impl (jitted), and the jitted gradient of a loss on o."""
    if impl == "cudnn":
        f = lambda q, kc, vc: cmp_attention_grouped(q, kc, vc, CFG, "cudnn")
    else:
        bs = BlockSizes.for_shape(Hq // G, D)
        f = lambda q, kc, vc: cmp_attention(q, kc, vc, CFG, bs, 1 / math.sqrt(D), False)

    def loss(q, kc, vc, c):
        o = f(q, kc, vc)
        o = o[0] if isinstance(o, tuple) else o
        return jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))
    return jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["bench", "125m"], choices=sorted(SHAPES))
    p.add_argument("--T", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out")
    a = p.parse_args(argv)
    rows = []
    for shape in a.shapes:
        Hq, G, D = SHAPES[shape]
        for T in a.T:
            x = make_inputs(T, T, Hq, G, D)
            row = {"shape": shape, "T": T, "device": jax.devices()[0].device_kind,
                   "jax": jax.__version__}
            for impl in ("pallas", "cudnn"):
                fwd, grad = branch(impl, Hq, G, D)
                row[f"cmp_fwd_{impl}"] = timed(fwd, [x[:3]], a.reps)
                row[f"cmp_fwd_bwd_{impl}"] = timed(grad, [(x[0], x[1], x[2], x[8])], a.reps)
                ch = KernelChoices(cmp_attn=impl)
                nsa = jax.jit(jax.grad(lambda *z, ch=ch: jnp.sum(
                    nsa_attention(*z[:8], CFG, impl="pallas", choices=ch).astype(jnp.float32)
                    * z[8].astype(jnp.float32)), argnums=tuple(range(8))))
                row[f"nsa_fwd_bwd_{impl}"] = timed(nsa, [x], a.reps)
            dense = jax.jit(jax.grad(lambda q, k, v, c: jnp.sum(jax.nn.dot_product_attention(
                q, k, v, is_causal=True, scale=1 / math.sqrt(D), implementation="cudnn")
                .astype(jnp.float32) * c.astype(jnp.float32)), argnums=(0, 1, 2)))
            row["dense_fwd_bwd"] = timed(dense, [(x[0], x[3], x[4], x[8])], a.reps)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if a.out:
                Path(a.out).write_text(json.dumps(rows, indent=1))
    print(f"{'shape':6s} {'T':>6s} {'cmp f':>8s} {'cudnn f':>8s} {'cmp f+b':>8s} {'cudnn f+b':>9s} "
          f"{'nsa f+b':>8s} {'nsa cudnn':>9s} {'dense':>8s}")
    for r in rows:
        print(f"{r['shape']:6s} {r['T']:6d} {r['cmp_fwd_pallas']:8.2f} {r['cmp_fwd_cudnn']:8.2f} "
              f"{r['cmp_fwd_bwd_pallas']:8.2f} {r['cmp_fwd_bwd_cudnn']:9.2f} "
              f"{r['nsa_fwd_bwd_pallas']:8.2f} {r['nsa_fwd_bwd_cudnn']:9.2f} "
              f"{r['dense_fwd_bwd']:8.2f}")


if __name__ == "__main__":
    main()
