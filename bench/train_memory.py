"""Compiled peak memory of the product's train step (compile only, nothing runs), per
(model, T:B point, config overrides): what a kernel choice costs in memory.

    PYTHONPATH=. python bench/train_memory.py --points 65536:1 \
        --variants "" "exec.kernel.sel_dq=query" [--models nsa_125m] [--out F]

Each variant is a space-separated list of ``key=value`` overrides ("" = the config as is). The
peak is XLA's ``memory_analysis()``: arguments + outputs + temporaries - aliased, as
``bench/train_throughput.py`` reports it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402

from train_throughput import build_point  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["nsa_125m"])
    p.add_argument("--points", nargs="+", default=["65536:1"])
    p.add_argument("--variants", nargs="+", default=[""])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out")
    a = p.parse_args(argv)
    rows = []
    for pt in a.points:
        T, B = (int(x) for x in pt.split(":"))
        for name in a.models:
            for var in a.variants:
                extra = tuple(var.split())
                _, _, step, state, batches = build_point(name, T, B, 1, a.smoke, None,
                                                         extra=extra)
                mem = step.lower(state, batches[0]).compile().memory_analysis()
                gb = None if mem is None else round(
                    (mem.argument_size_in_bytes + mem.output_size_in_bytes
                     + mem.temp_size_in_bytes - mem.alias_size_in_bytes) / 2**30, 3)
                r = {"model": name, "seq_len": T, "batch": B, "overrides": list(extra),
                     "compiled_peak_gb": gb, "temp_gb": None if mem is None else
                     round(mem.temp_size_in_bytes / 2**30, 3)}
                print(json.dumps(r), flush=True)
                rows.append(r)
                del state, step, batches
    if a.out:
        Path(a.out).write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                           "jax": jax.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
