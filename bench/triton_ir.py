"""The Triton IR of the NSA op's Pallas kernels, lowered for CUDA on any machine (no GPU needed).

    python bench/triton_ir.py OUT.txt [--routes NAME ...] [--shape 125m|bench]
    cmp before.txt after.txt    # a refactor that claims "same kernels" should give identical files

For each route (dtype, packed rows, selection kernels; the compressed branch through the Pallas
kernels, since cuDNN does not lower without a GPU) the op's forward and backward are exported with
``jax.export`` for CUDA, and every Triton module Pallas builds on the way is written out as text
*without source locations*, one ``tt.func`` per kernel. Two trees whose files are byte-identical
compile to the same kernels, so a code move or a shared helper (e.g. ``common.dkv_accumulate``,
twenty-second session) can be shown to change no kernel without device time. ``--shape`` picks the
head layout, and with it the tiles ``BlockSizes.for_shape`` gives (the 128-wide heads of the bench
shape take their own); T = 1024, one row. Not covered: cuDNN; the decode kernels are lowered by
``decode_route`` (for ``bench/kernel_sass.py``), not by this script's routes.
``lower_for_cuda`` and ``route`` are also what ``tests/test_triton_lowering.py`` lowers with.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys

import jax
import jax.numpy as jnp
from jax import export
from jax._src.pallas.triton import lowering as triton_lowering

import nsa_jax.pallas.chunk as pchunk
import nsa_jax.pallas.common as pcommon
import nsa_jax.pallas.decode as pdecode
import nsa_jax.pallas.decode_dense as pdecode_dense
import nsa_jax.pallas.local as plocal
import nsa_jax.pallas.nsa as pnsa
from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.options import KernelChoices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SHAPES  # noqa: E402  (Hq, G, D per shape)

TRITON = "__gpu$xla.gpu.triton"
CFG = NSAConfig()
B, T = 1, 1024
ROUTES = {   # name -> (dtype, packed rows, sel_impl, sel_fwd = sel_dq)
    "bf16-packed-tiled": (jnp.bfloat16, True, "tiled", "query"),
    "bf16-packed-block": (jnp.bfloat16, True, "gather", "block"),
    "bf16-packed-query": (jnp.bfloat16, True, "gather", "query"),
    "f32-tiled": (jnp.float32, False, "tiled", "query"),
    "f32-query": (jnp.float32, False, "gather", "query"),
    "f32-block": (jnp.float32, False, "gather", "block"),
}


def route(name: str, shape: str = "125m", **kw):
    """-> (f, arg shapes): the op's fwd+bwd by route ``name`` (``ROUTES``; the compressed branch
    through the Pallas kernels) for the head layout ``SHAPES[shape]``; ``kw`` go to
    ``nsa_attention_pallas`` (e.g. ``block_sizes``). Packed routes take segment ids last."""
    return op_route(*ROUTES[name], shape, T, **kw)


def op_route(dtype, packed: bool, sel_impl: str, sel_fwd: str, shape: str = "125m", T: int = T,
             choices: dict | None = None, **kw):
    """:func:`route` for any (dtype, packed rows, sel_impl, sel_fwd = sel_dq) and length T (one
    row), not only the named ``ROUTES``; also what ``bench/kernel_sass.py`` lowers. ``choices``:
    more ``KernelChoices`` fields (e.g. ``{"sel_bwd": "atomic"}``)."""
    choices = KernelChoices(sel_impl=sel_impl, sel_fwd=sel_fwd, sel_dq=sel_fwd, cmp_attn="pallas",
                            **(choices or {}))
    S = jax.ShapeDtypeStruct
    Hq, G, D = SHAPES[shape]
    Tc = CFG.num_cmp_blocks(T)
    shapes = [S((B, T, Hq, D), dtype), S((B, Tc, G, D), dtype), S((B, Tc, G, D), dtype)]
    shapes += [S((B, T, G, D), dtype)] * 4 + [S((B, T, Hq, 3), dtype)]
    shapes += [S((B, T), jnp.int32)] if packed else []

    def f(*a):
        seg = {"segment_ids": a[-1]} if packed else {}
        args = a[:-1] if packed else a
        o, vjp = jax.vjp(lambda *x: pnsa.nsa_attention_pallas(*x, CFG, choices=choices, **seg,
                                                              **kw), *args)
        return o, vjp(o)
    return f, shapes


def decode_route(shape: str = "125m", T: int = 65536, B: int = 8, dtype=jnp.bfloat16):
    """-> (f, arg shapes): one decode step of the Pallas decode kernels
    (``pallas.decode.nsa_decode_pallas``, all three branches) at context T (the caches' length)
    and batch B for the head layout ``SHAPES[shape]``; also what ``bench/kernel_sass.py --route
    decode`` lowers."""
    S = jax.ShapeDtypeStruct
    Hq, G, D = SHAPES[shape]
    names = ("k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win")
    lens = (CFG.num_cmp_blocks(T),) * 2 + (CFG.num_sel_blocks(T) * CFG.sel_block,) * 2 \
        + (CFG.window,) * 2
    shapes = [S((B, Hq, D), dtype)] + [S((B, G, n, D), dtype) for n in lens]
    shapes += [S((B,), jnp.int32), S((B, Hq, 3), jnp.float32)]

    def f(q, *a):
        *caches, t, gates = a
        return pdecode.nsa_decode_pallas(q, dict(zip(names, caches)), t, gates, CFG)
    return f, shapes


@contextlib.contextmanager
def compiled():
    """The kernel entry points pick compiled (not interpret) kernels on this machine too
    (``common.use_interpret`` itself for the model's decode-step cache writes, which read it
    through ``attention_modules.fused_writes``)."""
    saved = {m: m.use_interpret for m in (pnsa, pdecode, plocal, pchunk, pcommon, pdecode_dense)}
    for m in saved:
        m.use_interpret = lambda: False
    try:
        yield
    finally:
        for m, fn in saved.items():
            m.use_interpret = fn


def lower_for_cuda(f, *shapes, on_module=None) -> str:
    """Export ``jit(f)`` for CUDA with compiled Pallas kernels (``jax.export``: the Pallas ->
    Triton lowering runs, no GPU needed); ``on_module(module)`` sees each Triton module as it is
    built. -> the exported module's text."""
    build = triton_lowering.lower_jaxpr_to_triton_module

    def hooked(*args, **kw):
        result = build(*args, **kw)
        if on_module is not None:
            on_module(result.module)
        return result

    triton_lowering.lower_jaxpr_to_triton_module = hooked
    try:
        with compiled():
            exp = export.export(jax.jit(f), platforms=["cuda"], disabled_checks=[
                export.DisabledSafetyCheck.custom_call(TRITON)])(*shapes)
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = build
    return exp.mlir_module()


def route_ir(name: str, shape: str = "125m") -> str:
    """The location-free text of every Triton module the route's fwd+bwd lowers, in order, for
    the head layout ``SHAPES[shape]``."""
    f, shapes = route(name, shape)
    modules = []
    lower_for_cuda(f, *shapes,
                   on_module=lambda m: modules.append(m.operation.get_asm(enable_debug_info=False)))
    return "\n".join(modules)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--routes", nargs="+", choices=sorted(ROUTES), default=list(ROUTES))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="125m")
    a = ap.parse_args(argv)
    with open(a.out, "w") as fh:
        for name in a.routes:
            text = route_ir(name, a.shape)
            fh.write(f"=== {name}\n{text}\n")
            print(f"{name:20s} {text.count('tt.func '):3d} kernels  "
                  f"sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
