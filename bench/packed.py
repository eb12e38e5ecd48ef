"""Packed documents (issue #16): attention time with and without packing, forward + backward.

Dense: the model's packed path (the document-local Pallas kernel, ``dense_packed_attention(...,
"pallas")``) against plain causal cuDNN. NSA: ``nsa_attention(impl="pallas")`` with
``segment_ids`` against the same call without (bf16, the 125M shape by default: 12 heads,
2 KV groups, D=64, paper NSA config). Window: the NSA window branch alone
(``pallas.window.window_attention``: cuDNN's local window unpacked, the document-local kernel
packed). Parts: each NSA part alone (selection, compressed, selected, window), packed vs unpacked,
to find where packing costs. Prints one JSON line per (attention, T, mode) and the
packed/unpacked speed ratio (target >= 0.9). ``--cmp-attn``: ``KernelChoices.cmp_attn`` of the NSA
and parts runs (several values: each one run and labelled; default the product's "auto");
``--packed-sel``: ``sel_fwd``/``sel_dq`` of the packed NSA run (query- or block-major selection
kernels; default "auto", the product's choice for packed rows); ``--packed-choices k=v ...``: more
``KernelChoices`` fields of the packed NSA run (e.g. ``sel_impl=tiled``), recorded in its label.

    python bench/packed.py --T 8192 65536 [--attention dense nsa window parts] [--cmp-attn auto]
        [--packed-sel auto block] [--packed-choices sel_impl=tiled]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fields, timed  # noqa: E402

from nsa_jax.dense_packed import dense_packed_attention  # noqa: E402
from nsa_jax.nsa import KernelChoices, NSAConfig, nsa_attention  # noqa: E402
from nsa_jax.nsa.options import CMP_ATTNS  # noqa: E402


def doc_lengths(T: int, mean: int, seed: int = 0) -> list[int]:
    """Geometric-ish document lengths (mean ``mean``) filling T tokens; the last one is cut."""
    rng = np.random.default_rng(seed)
    out, n = [], 0
    while n < T:
        L = int(min(T - n, max(1, rng.exponential(mean))))
        out.append(L)
        n += L
    return out


def segment_ids(T: int, mean: int, B: int = 1, seed: int = 0):
    """int32 [B, T]: ``doc_lengths(T, mean, seed)`` as one id per document, the same in every
    row; -> (segment ids, number of documents)."""
    lengths = doc_lengths(T, mean, seed)
    row = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    return jnp.asarray(np.broadcast_to(row, (B, T))), len(lengths)


def compare(a, attention, T, docs, unpacked, packed, args, **label):
    """Time both functions on ``args``; one JSON line each and one with the speed ratio
    (``label``: extra keys of every line)."""
    ms = {}
    for name, fn in (("unpacked", unpacked), ("packed", packed)):
        ms[name] = timed(fn, [args], a.reps)
        print(json.dumps({"attention": attention, "T": T, "mode": name, "docs": docs, **label,
                          "fwd_bwd_ms": round(ms[name], 3),
                          "device": jax.devices()[0].device_kind}), flush=True)
    print(json.dumps({"attention": attention, "T": T, **label,
                      "packed_speed_over_unpacked": round(ms["unpacked"] / ms["packed"], 3)}),
          flush=True)
    return ms


def nsa_inputs(a, T, cfg):
    """Random bf16 NSA inputs (the 8 arguments) and an output cotangent at the --heads/--groups/
    --head-dim shape, B=1."""
    rng = np.random.default_rng(2)
    Tc = cfg.num_cmp_blocks(T)
    n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
    H, G, D = a.heads, a.groups, a.head_dim
    args = (n(1, T, H, D), n(1, Tc, G, D), n(1, Tc, G, D), n(1, T, G, D), n(1, T, G, D),
            n(1, T, G, D), n(1, T, G, D),
            jax.nn.sigmoid(n(1, T, H, 3).astype(jnp.float32)).astype(jnp.bfloat16))
    return args, n(1, T, H, D)


def nsa_bench(a, T, seg, docs, cmp_attn, packed_sel="auto", extra=None):
    """NSA fwd+bwd through the Pallas kernels, packed (segment_ids) and unpacked (the product's
    choices, ``cmp_attn`` aside). ``packed_sel``: the packed run's ``sel_fwd`` and ``sel_dq``
    ("auto" = the product's choice for packed rows); ``extra``: more ``KernelChoices`` fields of
    the packed run."""
    cfg = NSAConfig()
    args, ct = nsa_inputs(a, T, cfg)
    ch = KernelChoices(cmp_attn=cmp_attn)
    sel = {} if packed_sel == "auto" else {"sel_fwd": packed_sel, "sel_dq": packed_sel}
    ch_packed = KernelChoices(cmp_attn=cmp_attn, **sel, **(extra or {}))

    def fb(seg_ids, ch):
        def f(args, ct):
            o, vjp = jax.vjp(lambda *x: nsa_attention(*x, cfg, impl="pallas", choices=ch,
                                                      segment_ids=seg_ids), *args)
            return o, vjp(ct)
        return jax.jit(f)

    label = {"packed_choices": extra} if extra else {}
    compare(a, "nsa", T, docs, fb(None, ch), fb(seg, ch_packed), (args, ct), cmp_attn=cmp_attn,
            packed_sel=packed_sel, **label)


def branches_bench(a, T, seg, docs, cmp_attn):
    """Where packing costs: each part of the NSA op alone, packed vs unpacked, fwd+bwd through
    the Pallas kernels: ``select`` (compressed lse + scores + top-n, forward only), ``cmp``,
    ``slc`` (with that mode's own selection given) and ``win`` (``NSAConfig.branches``)."""
    import dataclasses

    from nsa_jax.nsa import select_blocks
    base = NSAConfig()
    args, ct = nsa_inputs(a, T, base)
    ch = KernelChoices(cmp_attn=cmp_attn)
    for mode, s in (("unpacked", None), ("packed", seg)):
        sel = jax.jit(lambda q, kc, s=s: select_blocks(q, kc, base, impl="pallas",
                                                       segment_ids=s))
        row = {"attention": "nsa-parts", "T": T, "mode": mode, "docs": docs, "cmp_attn": cmp_attn,
               "select_fwd_ms": round(timed(sel, [(args[0], args[1])], a.reps), 3)}
        idx = sel(args[0], args[1])
        for br in ("cmp", "slc", "win"):
            cfg = dataclasses.replace(base, branches=(br,))

            def f(args, ct, cfg=cfg, s=s):
                o, vjp = jax.vjp(lambda *x: nsa_attention(*x, cfg, impl="pallas", segment_ids=s,
                                                          block_idx=idx, choices=ch), *args)
                return o, vjp(ct)
            row[f"{br}_fwd_bwd_ms"] = round(timed(jax.jit(f), [(args, ct)], a.reps), 3)
        print(json.dumps(row), flush=True)


def window_bench(a, T, seg, docs):
    """The NSA window branch alone, fwd+bwd: unpacked (cuDNN) and packed (document-local)."""
    from nsa_jax.nsa import semantics
    from nsa_jax.pallas.window import window_attention
    cfg = NSAConfig()
    rng = np.random.default_rng(3)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((1, T, n, a.head_dim)), jnp.bfloat16)
                   for n in (a.heads, a.groups, a.groups, a.heads))
    lay = semantics.segment_layout(seg, cfg)

    def fb(s):
        def f(q, k, v, ct):
            o, vjp = jax.vjp(lambda *x: window_attention(*x, cfg, False, seg=s), q, k, v)
            return o, vjp(ct.astype(jnp.float32))
        return jax.jit(f)

    compare(a, "window", T, docs, fb(None), fb(lay), (q, k, v, ct))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[8192, 65536])
    p.add_argument("--mean-doc", type=int, default=2048)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--attention", nargs="+", default=["dense", "nsa", "window"],
                   choices=["dense", "nsa", "window", "parts"])
    p.add_argument("--cmp-attn", nargs="+", default=["auto"], choices=list(CMP_ATTNS))
    p.add_argument("--packed-sel", nargs="+", default=["auto"], choices=["auto", "query", "block"],
                   help="sel_fwd and sel_dq of the packed NSA run (each value run and labelled)")
    p.add_argument("--packed-choices", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="more KernelChoices fields of the packed NSA run")
    a = p.parse_args(argv)
    extra = fields(a.packed_choices, KernelChoices)
    for T in a.T:
        seg, docs = segment_ids(T, a.mean_doc)
        for c in a.cmp_attn if "nsa" in a.attention else ():
            for ps in a.packed_sel:
                nsa_bench(a, T, seg, docs, c, ps, extra)
        if "window" in a.attention:
            window_bench(a, T, seg, docs)
        for c in a.cmp_attn if "parts" in a.attention else ():
            branches_bench(a, T, seg, docs, c)
        if "dense" not in a.attention:
            continue
        rng = np.random.default_rng(1)
        q, k, v, ct = (jnp.asarray(rng.standard_normal((1, T, n, a.head_dim)), jnp.bfloat16)
                       for n in (a.heads, a.groups, a.groups, a.heads))

        def fb(attn):
            def f(q, k, v, ct):
                o, vjp = jax.vjp(attn, q, k, v)
                return o, vjp(ct)
            return jax.jit(f)

        plain = fb(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                 implementation="cudnn"))
        packed = fb(lambda q, k, v: dense_packed_attention(q, k, v, seg, "pallas"))
        # packed attends only inside documents: less work, so >= 1 is expected; >= 0.9 required
        compare(a, "dense", T, docs, plain, packed, (q, k, v, ct))


if __name__ == "__main__":
    main()
