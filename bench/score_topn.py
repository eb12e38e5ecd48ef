"""Selection scoring (``nsa_cmp_scores``, Eq. 8-10) and top-n (``nsa_topn``, Eq. 11) timed
apart, per ``BlockSizes`` variant, with the result checked against the product's defaults.

    PYTHONPATH=. python bench/score_topn.py [--shape 125m] [--T 8192 65536] [--reps 20] \
        [--variants "topn_warps=1 topn_elems=1024" "score_warps=8" ...] [--out F]

Each variant is a space-separated list of ``BlockSizes`` or ``KernelChoices`` field overrides
("" = the defaults, always run first; e.g. "score_heads=loop score_q=64"). Scores must equal
the default's to 1e-6 relative and the ids exactly (the variants change tiles and the order of
the head sum, not the arithmetic). One more key, for a sweep only: ``tour_min_width=N`` sets
``nsa_jax.pallas.topn.TOUR_MIN_WIDTH`` (the narrowest bucket on the tournament kernel) while
that variant is traced, and restores it after. Inputs: ``bench/kernels.make_inputs`` (bf16, random),
lse from the Pallas compressed forward. Runs against an older tree too
(``PYTHONPATH=old/tree``: a ``topn_pallas`` without ``bs`` takes its fixed tile) for a
before/after in one call.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from harness import CFG, INTERP, SHAPES, fields, make_inputs, timed  # noqa: E402
from nsa_jax.pallas.scoring import cmp_block_scores  # noqa: E402

from nsa_jax.nsa.options import KernelChoices  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402
from nsa_jax.pallas.compressed import cmp_forward  # noqa: E402
from nsa_jax.pallas import topn as topn_mod  # noqa: E402
from nsa_jax.pallas.topn import topn_pallas  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="125m", choices=sorted(SHAPES))
    p.add_argument("--T", type=int, nargs="+", default=[8192, 65536])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--variants", nargs="*", default=[])
    p.add_argument("--out")
    a = p.parse_args(argv)
    Hq, G, D = SHAPES[a.shape]
    base = BlockSizes.for_shape(Hq // G, D, 2)
    scale = 1.0 / math.sqrt(D)
    rows = []
    kc_names = {f.name for f in dataclasses.fields(KernelChoices)}
    for T in a.T:
        x = make_inputs(0, T, Hq, G, D)
        q, kc = x[0], x[1]
        lse = jax.jit(lambda q, kc: cmp_forward(q, kc, None, CFG, base, scale, INTERP)[1])(q, kc)
        ref_s = ref_i = None
        for var in [""] + [v for v in a.variants if v]:
            specs = var.split()
            tmw = [int(x.split("=")[1]) for x in specs if x.startswith("tour_min_width=")]
            specs = [x for x in specs if not x.startswith("tour_min_width=")]
            saved = getattr(topn_mod, "TOUR_MIN_WIDTH", None)
            if tmw and saved is not None:
                topn_mod.TOUR_MIN_WIDTH = tmw[0]
            ch = KernelChoices(**fields([x for x in specs if x.split("=")[0] in kc_names],
                                        KernelChoices))
            bs = dataclasses.replace(base, **fields(
                [x for x in specs if x.split("=")[0] not in kc_names], BlockSizes))
            score = jax.jit(lambda q, kc, lse, bs=bs, ch=ch: cmp_block_scores(
                q, kc, lse, CFG, bs, scale, INTERP, choices=ch))
            kw = {"bs": bs} if "bs" in inspect.signature(topn_pallas).parameters else {}
            topn = jax.jit(lambda s, kw=kw: topn_pallas(s, CFG, INTERP, **kw))
            r = {"T": T, "variant": var or "default"}
            if tmw and saved is None:
                r["dropped"] = "tour_min_width (this tree has no TOUR_MIN_WIDTH)"
            try:
                s = score(q, kc, lse)
                i = topn(s)
                if ref_s is None:
                    ref_s, ref_i = s, i
                err = float(jnp.linalg.norm(s - ref_s) / jnp.linalg.norm(ref_s))
                r["scores_rel_err"] = err
                r["ids_equal"] = bool(jnp.all(i == ref_i))
                r["scores_ms"] = round(timed(score, [(q, kc, lse)], a.reps), 4)
                r["topn_ms"] = round(timed(topn, [(s,)], a.reps), 4)
            except Exception as e:  # keep going: one failing variant must not hide the others
                r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            finally:
                if saved is not None:
                    topn_mod.TOUR_MIN_WIDTH = saved
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                           "jax": jax.__version__, "shape": a.shape,
                                           "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['T']:6d} {r['variant']:40s} scores {r.get('scores_ms')} topn {r.get('topn_ms')}"
              f" ok={r.get('ids_equal')} {r.get('error', '')}")


if __name__ == "__main__":
    main()
