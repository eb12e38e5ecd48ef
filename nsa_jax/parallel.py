"""Batch parallelism for custom kernels: run an attention call once per device shard of the batch.

XLA's sharding propagation cannot split a Pallas/Triton custom call: handed a batch-sharded
operand it all-gathers the batch and every device computes the whole batch. :func:`batch_parallel`
wraps such a call in ``jax.shard_map`` over the mesh's batch axes, so each device runs the kernels
on its own rows only (attention never mixes rows, so no collective is needed; the backward pass
is the shard_map's transpose).

The mesh is the ambient abstract mesh: the train and eval steps trace under
``jax.sharding.use_abstract_mesh(mesh.abstract_mesh)`` (:func:`mesh_context`). Outside one (or
on a single device) the call runs unchanged, e.g. in decoding and in the CPU tests.
"""
from __future__ import annotations

import contextlib

import jax
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")   # the training mesh's axes (train.mesh); rows split over both


def mesh_context(mesh):
    """Context under which :func:`batch_parallel` sees ``mesh`` (a no-op for ``None``)."""
    if mesh is None:
        return contextlib.nullcontext()
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def _batch_axes():
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None, ()
    axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
    return mesh, axes


def batch_parallel(fn, *args):
    """``fn(*args)`` with every arg (and the result) split over the batch axes along dim 0.

    Every argument and the output must have the batch as their leading dimension, divisible by
    the product of the batch axes' sizes (the trainer checks the batch size up front).
    """
    mesh, axes = _batch_axes()
    if not axes:
        return fn(*args)
    n = 1
    for a in axes:
        n *= mesh.shape[a]
    for i, x in enumerate(args):
        if x.shape[0] % n:
            raise ValueError(f"batch_parallel: argument {i} has batch {x.shape[0]}, not divisible "
                             f"by the {n} devices of mesh axes {axes}")
    spec = P(axes)
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * len(args), out_specs=spec,
                         check_vma=False)(*args)
