"""Tile settings of a chunked prefill's continuation chunk on the Pallas kernels (``nsa_jax/pallas/
chunk.py``): one continuation chunk of one layer, timed alone for each setting.

    PYTHONPATH=. python bench/chunk_tiles.py [--start 49152] [--chunk 16384] [--cache 65600]
        [--reps 10] [--out F.json] [--only-default] [--only NAME ...] [--kinds dense nsa]
        [--profile N] [--smoke]

Shape: the 125M model's heads (``harness.SHAPES["125m"]``: 12 query heads, 2 KV groups,
64-wide), batch 1, bf16, random caches of ``--cache`` tokens, the chunk's queries at positions
start .. start + chunk - 1, ``harness.CFG`` (the 125M configs' NSA settings). For each setting (a
``BlockSizes`` override, and for NSA optionally ``KernelChoices`` fields, listed in ``DENSE``
and ``NSA``) the median wall time of ``--reps`` jitted calls (``harness.timed``: after the
compiling call and 3 warm-up calls); dense and NSA
outputs are checked against the first setting's (all settings compute the same attention). The
table prints last; the JSON holds the device, versions and every record. ``--kinds`` picks dense
and / or NSA; ``--only`` keeps the settings of those names. ``--profile N`` also traces N calls of
each setting (``jax.profiler``) and records its kernels' device time per call
(``profile_step.summarise``), so a setting's change reads kernel by kernel. ``--smoke`` shrinks
the shape for the CPU (interpret mode; not a measurement).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import CFG, SHAPES, timed  # noqa: E402
from profile_step import load_trace, summarise  # noqa: E402

from nsa_jax.pallas.chunk import dense_chunk_pallas, nsa_chunk_pallas  # noqa: E402
from nsa_jax.nsa.options import KernelChoices  # noqa: E402
from nsa_jax.pallas.common import BlockSizes  # noqa: E402

# (name, BlockSizes fields over BlockSizes.for_shape's defaults; "choices": KernelChoices fields)
DENSE = [
    ("default", {}),
    ("q128", dict(win_q=128)),
    ("q128 w8", dict(win_q=128, num_warps=8)),
    ("q128 k128 w8", dict(win_q=128, win_keys=128, num_warps=8)),
    ("k128", dict(win_keys=128)),
    ("s3", dict(num_stages=3)),
    ("q128 s3", dict(win_q=128, num_stages=3)),
]
NSA = [
    ("default", {}),
    ("sel w1", dict(sel_warps=1)),
    ("sel w4", dict(sel_warps=4)),
    ("sel s3", dict(sel_stages=3)),
    ("sel k32 w1 s3", dict(sel_q_keys=32, sel_warps=1, sel_stages=3)),
    # the compressed forward and scores at small chunks (fiftieth session: at C = 4,096 the
    # scoring kernel's 64-query tiles give 128 programs for 132 SMs, each walking every visible
    # compressed block in turn)
    ("score q32", dict(score_q=32)),
    ("score q16", dict(score_q=16)),
    ("cmp rows64", dict(cmp_rows=64)),
    ("cmp rows64 keys64", dict(cmp_rows=64, cmp_keys=64)),
    ("cmp rows64 score q16", dict(cmp_rows=64, score_q=16)),
    # the scoring kernel's key-range splits (fifty-first session; default: scoring.score_splits,
    # 4 at C = 4,096 and 1 at 16,384 for these heads)
    ("score split1", dict(score_splits=1)),
    ("score split2", dict(score_splits=2)),
    ("score split4", dict(score_splits=4)),
    ("score split8", dict(score_splits=8)),
    # the compressed attention on the Pallas kernel or on cuDNN in the grouped layout (fifty-first
    # session; "auto" takes cuDNN for caches longer than cmp_pallas_max_t)
    ("cmp pallas", dict(choices=dict(cmp_attn="pallas"))),
    ("cmp cudnn", dict(choices=dict(cmp_attn="cudnn"))),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=int, default=49152)
    p.add_argument("--chunk", type=int, default=16384)
    p.add_argument("--cache", type=int, default=65600)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None)
    p.add_argument("--only-default", action="store_true", help="time the default setting only")
    p.add_argument("--only", nargs="+", default=None, help="the settings of these names only")
    p.add_argument("--kinds", nargs="+", choices=["dense", "nsa"], default=["dense", "nsa"])
    p.add_argument("--profile", type=int, default=0, help="trace N calls of each setting")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    cfg = CFG
    if a.smoke:
        a.start, a.chunk, a.cache, a.reps = 128, 64, 256, 1
    (Hq, G, D), B, C, S = SHAPES["125m"], 1, a.chunk, a.cache
    Tc = cfg.num_cmp_blocks(S)
    W = cfg.window
    ks = jax.random.split(jax.random.PRNGKey(0), 8)
    bf = jnp.bfloat16
    q = jax.random.normal(ks[0], (B, C, Hq, D), bf)
    lc = {"k_cmp": jax.random.normal(ks[1], (B, G, Tc, D), bf),
          "v_cmp": jax.random.normal(ks[2], (B, G, Tc, D), bf),
          "k_slc": jax.random.normal(ks[3], (B, G, S, D), bf),
          "v_slc": jax.random.normal(ks[4], (B, G, S, D), bf)}
    kw, vw = (jax.random.normal(k, (B, G, W + C, D), bf) for k in ks[5:7])
    gates = jax.nn.sigmoid(jax.random.normal(ks[7], (B, C, Hq, 3))).astype(bf)
    t = a.start + jnp.arange(C, dtype=jnp.int32)
    span = (kw, vw, t[0] - W + jnp.arange(W + C))
    base = BlockSizes.for_shape(Hq // G, D, 2)
    records = []
    for kind, settings in [(k, {"dense": DENSE, "nsa": NSA}[k]) for k in a.kinds]:
        ref = None
        chosen = settings[:1] if a.only_default else settings
        if a.only:
            unknown = set(a.only) - {n for n, _ in settings}
            if unknown and kind == a.kinds[-1] and len(a.kinds) == 1:
                p.error(f"--only: no {kind} setting named {sorted(unknown)}")
            chosen = [(n, o) for n, o in settings if n in a.only]
        for name, over in chosen:
            tiles = {k: v for k, v in over.items() if k != "choices"}
            bs = dataclasses.replace(base, **tiles)
            ch = KernelChoices(**over.get("choices", {}))
            if kind == "dense":
                fn = jax.jit(lambda q, k, v, t, bs=bs: dense_chunk_pallas(q, k, v, t,
                                                                          block_sizes=bs))
                args = (q, lc["k_slc"], lc["v_slc"], t)
            else:
                fn = jax.jit(lambda q, lc, span, t, g, bs=bs, ch=ch: nsa_chunk_pallas(
                    q, lc, span, t, g, cfg, choices=ch, block_sizes=bs))
                args = (q, lc, span, t, gates)
            out = np.asarray(fn(*args), np.float32)
            ms = timed(fn, [args], a.reps)
            if ref is None:
                ref = out
            diff = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
            records.append(dict(kind=kind, name=name, settings=over, ms=ms,
                                max_rel_diff_vs_default=diff))
            if a.profile:
                records[-1]["profile"] = _profile(fn, args, a.profile)
            print(json.dumps(records[-1]), flush=True)
    info = dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                python=platform.python_version(), smoke=a.smoke, start=a.start, chunk=C,
                cache=S, records=records)
    if a.out:
        Path(a.out).write_text(json.dumps(info, indent=1))
    print(f"\n{info['device']}, jax {info['jax']}; 125M heads, B=1, bf16, chunk {C} at start "
          f"{a.start} over a {S}-token cache; ms = median of {a.reps}")
    print(f"{'kind':6} {'setting':22} {'ms':>9} {'max rel diff':>13}")
    for r in records:
        print(f"{r['kind']:6} {r['name']:22} {r['ms']:9.3f} {r['max_rel_diff_vs_default']:13.2e}")
        if "profile" in r:
            pr = r["profile"]
            print(f"       busy {pr['busy_ms']:.3f} ms, span {pr['span_ms']:.3f} ms per call: "
                  + ", ".join(f"{k['name'][:24]} {k['ms']:.3f}" for k in pr["kernels"][:6]))
    return 0


def _profile(fn, args, n: int) -> dict:
    """Device time per call of ``fn(*args)`` over n traced calls: busy and span ms, and the
    kernels (name, ms per call, launches per call), most first."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(n):
                out = fn(*args)
            jax.block_until_ready(out)
        s = summarise(load_trace(d), n, 12)
    return {"busy_ms": s["device_busy_ms_per_step"], "span_ms": s["device_span_ms_per_step"],
            "gpu_trace": s["gpu_trace"],
            "kernels": [{"name": k["name"], "ms": k["ms_per_step"], "calls": k["calls_per_step"]}
                        for k in s["top_kernels"]]}


if __name__ == "__main__":
    raise SystemExit(main())
