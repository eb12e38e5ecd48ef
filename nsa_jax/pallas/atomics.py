"""Relaxed atomic adds for the kernels' float32 accumulators (dK/dV tiles summed over programs).

``jax.experimental.pallas.triton.atomic_add`` lowers every atomic with acquire-release
semantics at GPU scope (``tt.atomic_rmw ... acq_rel, gpu``). For sm_90 Triton turns each
vector atomic of such a tile into ``MEMBAR.ALL.GPU; ATOMG.E.ADD.F32x4.STRONG.GPU; CCTL.IVALL``:
a GPU-wide fence that waits for every earlier store of the thread, then an L1 invalidation.
A [64, 64] float32 dK and dV pair is 16 such vectors per thread, so the epilogue of every
work item waits out 16 fence round trips in a row (bench/NOTES.md, fortieth session).

The kernels' accumulations need none of that ordering: each program adds its partial dK/dV
into a buffer no program reads, and the kernel's end orders them for the next kernel. So
``add`` binds a primitive of its own whose Triton lowering is the same ``tt.atomic_rmw fadd``
with *relaxed* semantics (no fence, no invalidation); its abstract evaluation and interpret
mode (state discharge) are jax's own atomic add's. Counters that order memory between
programs (``phi_decode``'s completion counter) keep ``plgpu.atomic_add``.

This reaches into jax's private Pallas modules (``jax._src.pallas.triton``), the same names in
jax 0.10.2 and 0.11.2; ``tests/test_triton_lowering.py`` checks the lowered IR, so an upgrade
that renames them fails there, not on a GPU.
"""
from __future__ import annotations

import jax

try:
    from jax._src import core as jax_core
    from jax._src import state
    from jax._src import tree_util
    from jax._src.lib.triton import dialect as tt_dialect
    from jax._src.pallas.triton import lowering as tlowering
    from jax._src.pallas.triton import primitives as tprims
    from jax._src.state import discharge as state_discharge
    from jax._src.state import indexing
    from jax._src.state import primitives as state_primitives

    _ADD = tprims.AtomicOpType.ADD
    for _name in ("_atomic_abstract_eval", "atomic_rmw_p"):
        getattr(tprims, _name)
    for _name in ("_atomic_rmw", "_compute_pointers_from_indices", "_ensure_ir_value"):
        getattr(tlowering, _name)
except (ImportError, AttributeError) as e:   # pragma: no cover (a jax this was not written for)
    raise ImportError(
        f"nsa_jax.pallas.atomics: jax {jax.__version__} lacks a private Pallas-Triton name it "
        f"uses ({e}); it was written against jax 0.10.2 and 0.11.2") from e

relaxed_add_p = jax_core.Primitive("nsa_relaxed_atomic_add")


@relaxed_add_p.def_effectful_abstract_eval
def _abstract_eval(*avals_flat, args_tree):
    return tprims._atomic_abstract_eval(*avals_flat, args_tree=args_tree, atomic_type=_ADD)


def _discharge(*args, args_tree, **kw):
    """Interpret mode: jax's own rule, except for gathered (array) indices, whose update is a
    scatter-*add* here: jax's rule sets ``old + val``, so of two lanes at one address only one
    add would land, where the GPU's atomics add both (``tests/test_atomics.py``). Out-of-bounds
    lanes are dropped, as the scatter drops them. jax's leading positional arguments differ
    between versions ((in_avals, out_avals) in 0.10.2, a context in 0.11): passed through; the
    operands are the last ``args_tree.num_leaves`` (``add`` binds no mask), and the result has
    one entry per operand."""
    lead, flat = args[:len(args) - args_tree.num_leaves], args[len(args) - args_tree.num_leaves:]
    ref, transforms, val, _ = args_tree.unflatten(flat)
    *prev, idx = transforms
    gathered = (all(not isinstance(s, indexing.Slice) for s in idx.indices)
                and any(jax.numpy.shape(s) for s in idx.indices))
    if prev or not gathered:
        rule = state_discharge._discharge_rules[tprims.atomic_rmw_p]
        return rule(*lead, *flat, args_tree=args_tree, atomic_type=_ADD, **kw)
    return (ref.at[idx.indices].add(val),) + (None,) * (len(flat) - 1), ref[idx.indices]


state_discharge.register_discharge_rule(relaxed_add_p)(_discharge)


@tlowering.register_lowering(relaxed_add_p)
def _lowering(ctx, *args_flat, args_tree):
    """jax's atomic add lowering (``primitives._atomic_lowering_rule``) for float values, with
    ``MemSemantic.RELAXED`` in place of its acquire-release."""
    block_info, *_ = ctx.block_infos
    ptr, indexers, val, mask = args_tree.unflatten(args_flat)
    *_, value_aval, mask_aval = args_tree.unflatten(ctx.avals_in)
    indexers = list(indexers)
    if not indexers or not isinstance(indexers[-1], indexing.NDIndexer):
        ref_aval = state.transform_type(indexers, ctx.avals_in[0])
        indexers.append(indexing.NDIndexer.make_trivial_indexer(ref_aval.shape))
    if len(indexers) != 1:
        raise NotImplementedError("atomics.add: one indexer per ref")
    ptr = tlowering._compute_pointers_from_indices(ptr, block_info, indexers[0])
    val = tlowering._ensure_ir_value(val, value_aval)
    if mask is not None:
        mask = tlowering._ensure_ir_value(mask, mask_aval)
    return tlowering._atomic_rmw(tt_dialect.RMWOp.FADD, ptr, val, mask=mask,
                                 semantic=tt_dialect.MemSemantic.RELAXED)


def add(ref, idx, val):
    """``ref[idx] += val`` atomically, relaxed (no ordering against other memory operations);
    float32 refs only. Lanes that share an address all add (gathered indices may repeat).
    Returns nothing (the old value is not needed by any caller)."""
    if ref.dtype != "float32":
        raise TypeError(f"atomics.add: float32 accumulators only, got {ref.dtype}")
    x_ref, transforms = state_primitives.get_ref_and_transforms(ref, idx, "atomic_rmw")
    args_flat, args_tree = tree_util.tree_flatten((x_ref, transforms, val, None))
    relaxed_add_p.bind(*args_flat, args_tree=args_tree)
