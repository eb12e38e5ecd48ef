"""The NSA op's "auto" kernel choices at head shapes other than the three the defaults were
tuned on: for each (heads, T x B) point, the op's forward + backward with the default
``KernelChoices`` against the alternatives "auto" decides between, in one process.

    PYTHONPATH=. python bench/shape_audit.py [--heads 16/16/64 16/8/64 16/4/64 32/8/128]
        [--points 2048:16 8192:4] [--variants NAME:k=v,k=v ...] [--reps 10] [--out F] [--smoke]

``--heads Hq/G/D`` (query heads, KV groups, head dim; the group size h = Hq / G). Variants per
point: ``default``; at T <= ``sel_tiled_max_t`` the gather selection kernels (``sel_impl=gather``),
the tiled forward / dQ on the other backend (Triton / Mosaic GPU) and the tiled dK/dV on Triton;
above it the tiled kernels (``sel_impl=tiled``) and the other gather forward (``sel_fwd``,
whose "auto" follows h <= ``SEL_FWD_BLOCK_MAX_H``). Each is timed as wall ms per fwd+bwd call
(median of ``--reps`` synced calls after 3 warm-up calls; ``harness.timed``), bf16 random inputs
(the selection comes from the op's own scoring and top-n), NSA's paper settings
(``harness.CFG``). A variant that cannot run at a shape (an explicit Mosaic GPU choice off
Hopper or at odd h) is recorded with its error, not timed. The table ends with each point's
fastest variant and the default's excess over it: a default more than 5% behind is a rule to
revisit (bench/NOTES.md). ``--variants`` replaces the list by explicit ones (``NAME`` alone or
``default``: the defaults; ``NAME:field=value,...``: ``KernelChoices`` overrides, typed as the
fields' defaults). Where the list has ``default``, it runs once more last, and the table takes
the faster of the two and prints how far apart they were: one run of a variant can be off by
much more than the spread of its 10 calls (thirty-third session: the default at 16 / 8 / 64, 2k
/ B=16 took 6.07 ms in one process and 4.76 in another). ``--smoke``: tiny T on the CPU
(interpret mode), not a measurement.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402

from harness import CFG, fields, make_inputs, timed  # noqa: E402

from nsa_jax.nsa import KernelChoices, nsa_attention  # noqa: E402
from nsa_jax.nsa.options import SEL_FWD_BLOCK_MAX_H  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402


DEFAULTS = ("default", "default (again)")   # the defaults' two runs at a point


def parse_heads(spec: str) -> tuple[int, int, int]:
    try:
        Hq, G, D = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--heads: expected Hq/G/D (e.g. 16/4/64), got {spec!r}")
    if Hq % G:
        raise SystemExit(f"--heads {spec}: Hq ({Hq}) must be a multiple of G ({G})")
    return Hq, G, D


def variants(h: int, D: int, T: int) -> list[tuple[str, dict]]:
    """(name, KernelChoices overrides) of the alternatives "auto" picks between at this point."""
    out = [("default", {})]
    if T <= KernelChoices().sel_tiled_max_t:
        out.append(("sel_impl=gather", {"sel_impl": "gather"}))
        other = "triton" if D >= 128 else "mosaic"
        out.append((f"tiled fwd+dq={other}", {"sel_tiled_fwd": other, "sel_tiled_dq": other}))
        out.append(("tiled dkv=triton", {"sel_tiled_dkv": "triton"}))
    else:
        out.append(("sel_impl=tiled", {"sel_impl": "tiled"}))
        flip = "query" if h <= SEL_FWD_BLOCK_MAX_H else "block"
        out.append((f"sel_fwd={flip}", {"sel_fwd": flip}))
    return out


def parse_variant(spec: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:field=value,...`` -> (NAME, KernelChoices overrides)."""
    name, _, over = spec.partition(":")
    return name, fields(over.split(",") if over else [], KernelChoices)


def run_point(Hq, G, D, T, B, reps, explicit=None):
    x = make_inputs(0, T, Hq, G, D, B=B)
    bs = BlockSizes.for_shape(Hq // G, D, 2)
    rows = []
    todo = list(explicit or variants(Hq // G, D, T))
    if any(name == DEFAULTS[0] for name, _ in todo):
        todo.append((DEFAULTS[1], {}))   # last: a drift between the two is the noise
    for name, over in todo:
        ch = KernelChoices(**over)

        @jax.jit
        def fb(args, ct, ch=ch):
            o, vjp = jax.vjp(lambda *y: nsa_attention(*y, CFG, impl="pallas", choices=ch,
                                                      block_sizes=bs), *args)
            return o, vjp(ct)

        t0 = time.perf_counter()
        row = {"heads": f"{Hq}/{G}/{D}", "h": Hq // G, "T": T, "B": B, "variant": name,
               "choices": over}
        try:
            row["ms"] = timed(fb, [(x[:8], x[8])], reps)
        except Exception as e:  # noqa: BLE001 -- recorded, the audit goes on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{row['heads']:>10s} {T:>6d}x{B:<3d} {name:24s} "
              + (f"{row['ms']:9.3f} ms" if "ms" in row else row["error"]), flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", nargs="+", default=["16/16/64", "16/8/64", "16/4/64", "32/8/128"])
    ap.add_argument("--points", nargs="+", default=["2048:16", "8192:4"])
    ap.add_argument("--variants", nargs="+", help="NAME:field=value,... (default: the list above)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="T=256, B=1 on the CPU")
    a = ap.parse_args(argv)
    heads = [parse_heads(s) for s in a.heads]
    explicit = [parse_variant(v) for v in a.variants] if a.variants else None
    points = [(256, 1)] if a.smoke else [tuple(int(v) for v in p.split(":")) for p in a.points]
    rows = []
    for Hq, G, D in heads:
        for T, B in points:
            rows += run_point(Hq, G, D, T, B, 1 if a.smoke else a.reps, explicit)
    print("\nheads        T x B   fastest variant            ms   default ms   default / fastest")
    summary = []
    for Hq, G, D in heads:
        for T, B in points:
            pt = [r for r in rows if r["heads"] == f"{Hq}/{G}/{D}" and r["T"] == T and "ms" in r]
            if not pt:
                continue
            best = min(pt, key=lambda r: r["ms"])
            runs = [r["ms"] for r in pt if r["variant"] in DEFAULTS]
            dflt = min(runs) if runs else float("nan")
            ratio = dflt / best["ms"]
            drift = max(runs) / min(runs) - 1 if len(runs) > 1 else float("nan")
            summary.append({"heads": f"{Hq}/{G}/{D}", "T": T, "B": B, "fastest": best["variant"],
                            "fastest_ms": best["ms"], "default_ms": dflt,
                            "default_runs_ms": runs, "default_over_fastest": ratio,
                            "default_drift": drift})
            print(f"{Hq:>3d}/{G}/{D:<4d} {T:>6d}x{B:<3d} {best['variant']:24s} {best['ms']:8.3f} "
                  f"{dflt:10.3f}   {ratio:.3f}   (default runs differ by {drift:.1%})"
                  + ("  <- revisit" if ratio > 1.05 else ""))
    if a.out:
        Path(a.out).write_text(json.dumps({
            "benchmark": "shape_audit", "device": jax.devices()[0].device_kind,
            "jax": jax.__version__, "cfg": dataclasses.asdict(CFG), "rows": rows,
            "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
