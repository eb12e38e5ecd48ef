"""One query-major selection forward (or backward) at the bench shape, for Nsight Compute (GPU).

    ncu --clock-control none -k regex:nsa_sel_fwd -c 1 --section SpeedOfLight ... \
        python3 bench/ncu_sel.py [--T 65536] [--set sel_q_keys=32 sel_stages=4]
    ncu ... -k regex:nsa_sel_bwd_dkv ... python3 bench/ncu_sel.py --kernel bwd [--choices sel_dq=ds]

``--kernel bwd`` runs the backward (``sel_backward``: the per-query dQ kernel ``nsa_sel_bwd_dq``,
the index, the inverted dK/dV kernel ``nsa_sel_bwd_dkv``) on the forward's output; ``--kernel
score`` the selection scoring kernel (``nsa_cmp_scores``, Eq. 9-10) on the compressed lse.

Builds the bench's inputs (random q, K, V, bf16, B=1, Hq=64, G=4, D=128, our own top-16 blocks,
as ``bench/kernels.py --sweep`` does), runs the chosen pass once to compile and once more, so a
profiler filtering on a kernel's name (``nsa_sel_fwd``; skip its first launch) sees a warm one;
``--set`` takes ``BlockSizes`` fields (name=value, ints), ``--choices`` ``KernelChoices`` fields
(name=value, typed as the field's default) for the backward.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CFG, INTERP, SHAPES, fields, make_inputs  # noqa: E402

from nsa_jax.nsa import KernelChoices  # noqa: E402
from nsa_jax.pallas import BlockSizes  # noqa: E402
from nsa_jax.pallas.compressed import cmp_forward  # noqa: E402
from nsa_jax.pallas.scoring import cmp_block_scores  # noqa: E402
from nsa_jax.pallas.selection import sel_backward, sel_forward  # noqa: E402
from nsa_jax.pallas.topn import topn_pallas  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=65536)
    ap.add_argument("--shape", default="bench", choices=sorted(SHAPES))
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=INT")
    ap.add_argument("--kernel", default="fwd", choices=["fwd", "bwd", "score"])
    ap.add_argument("--choices", nargs="*", default=[], metavar="FIELD=VALUE")
    a = ap.parse_args(argv)
    Hq, G, D = SHAPES[a.shape]
    base = BlockSizes.for_shape(Hq // G, D)
    bs = dataclasses.replace(base, **{k: int(v) for k, v in (s.split("=", 1) for s in a.set)})
    scale = 1.0 / math.sqrt(D)
    x = make_inputs(0, a.T, Hq, G, D)
    _, lse = cmp_forward(x[0], x[1], x[2], CFG, base, scale, INTERP)
    idx = topn_pallas(cmp_block_scores(x[0], x[1], lse, CFG, base, scale, INTERP), CFG, INTERP)
    fwd = jax.jit(lambda q, k, v, i: sel_forward(q, k, v, i, CFG, bs, scale, INTERP))
    if a.kernel == "score":
        score = jax.jit(lambda q, kc, lse: cmp_block_scores(q, kc, lse, CFG, bs, scale, INTERP))
        for _ in range(2):
            jax.block_until_ready(score(x[0], x[1], lse))
    elif a.kernel == "fwd":
        for _ in range(2):
            jax.block_until_ready(fwd(x[0], x[3], x[4], idx))
    else:
        o, lse = fwd(x[0], x[3], x[4], idx)
        ch = KernelChoices(**fields(a.choices, KernelChoices))
        bwd = jax.jit(lambda q, k, v, i, o, lse, do: sel_backward(
            q, k, v, i, o, lse, do, None, CFG, bs, scale, INTERP, choices=ch))
        for _ in range(2):
            jax.block_until_ready(bwd(x[0], x[3], x[4], idx, o, lse, x[8]))
    print(f"ran the selection {a.kernel} twice: {a.shape} T={a.T} {a.set} {a.choices}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
