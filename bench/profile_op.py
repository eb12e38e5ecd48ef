"""Profile the NSA op (forward + backward, ``impl="pallas"``) with ``jax.profiler`` and list the
device time per kernel: where one op's time goes, without a whole train step around it.

    PYTHONPATH=. python bench/profile_op.py [--shape 125m] [--T 65536] [--B 1] [--reps 3]
        [--choices sel_dq=block ...] [--tiles sel_dq_rows=64 ...] [--top 20] [--out F]
        [--packed-mean-doc 2048] [--warm-only]

Inputs are ``bench/kernels.make_inputs`` (bf16, random; the selection comes from the op's own
scoring + top-n). ``--choices`` / ``--tiles``: ``KernelChoices`` / ``BlockSizes`` fields
(defaults: the product's). ``--packed-mean-doc M``: each row packs documents of exponential
lengths with mean M (``bench/packed.segment_ids``, as ``bench/packed.py``) and the op gets their
``segment_ids``. The trace is summarised by ``bench/profile_step.summarise`` (ms per
call, by kernel and by XLA op). ``--warm-only``: compile and run the op ``--reps`` times with no
trace and no summary, for a kernel profiler outside the process (Nsight Compute's ``ncu -k
regex:NAME --launch-skip S``; CUPTI serves one profiler at a time).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402

from harness import CFG, SHAPES, fields, make_inputs  # noqa: E402
from packed import segment_ids  # noqa: E402
from profile_step import load_trace, summarise  # noqa: E402

from nsa_jax.nsa import KernelChoices, nsa_attention  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="125m", choices=sorted(SHAPES))
    p.add_argument("--T", type=int, default=65536)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--choices", nargs="*")
    p.add_argument("--tiles", nargs="*")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--out")
    p.add_argument("--packed-mean-doc", type=int, help="pack documents of this mean length")
    p.add_argument("--warm-only", action="store_true",
                   help="run the op --reps times with no trace (for ncu)")
    a = p.parse_args(argv)
    Hq, G, D = SHAPES[a.shape]
    x = make_inputs(0, a.T, Hq, G, D, B=a.B)
    ch = KernelChoices(**fields(a.choices, KernelChoices))
    bs = dataclasses.replace(BlockSizes.for_shape(Hq // G, D, 2), **fields(a.tiles, BlockSizes))
    seg, docs = segment_ids(a.T, a.packed_mean_doc, a.B) if a.packed_mean_doc else (None, None)

    @jax.jit
    def fb(args, ct):
        o, vjp = jax.vjp(lambda *y: nsa_attention(*y, CFG, impl="pallas", choices=ch,
                                                  block_sizes=bs, segment_ids=seg), *args)
        return o, vjp(ct)

    for _ in range(a.reps if a.warm_only else 3):
        jax.block_until_ready(fb(x[:8], x[8]))
    if a.warm_only:
        print(f"{a.shape} T={a.T} B={a.B}: ran the op {a.reps} times (no trace)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(a.reps):
                jax.block_until_ready(fb(x[:8], x[8]))
        r = summarise(load_trace(tmp), a.reps, a.top)
    r = {"shape": a.shape, "T": a.T, "B": a.B, "packed_mean_doc": a.packed_mean_doc,
         "docs": docs, "choices": dataclasses.asdict(ch),
         "tiles": dataclasses.asdict(bs), "device": jax.devices()[0].device_kind,
         "jax": jax.__version__, **r}
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1))
    print(f"{a.shape} T={a.T} B={a.B}{' packed' if seg is not None else ''}: device busy {r['device_busy_ms_per_step']:.2f} ms per "
          f"call, {r['n_kernels_per_step']:.0f} kernels")
    for k in r["top_kernels"]:
        print(f"  {k['ms_per_step']:8.3f} ms {k['share']:6.1%} x{k['calls_per_step']:<4.0f} "
              f"{k['name'][:100]}")


if __name__ == "__main__":
    main()
