"""Devices: optional multi-process start, the ('data', 'fsdp') mesh, shardings, batch placement.

Multi-process runs are started explicitly from the CLI (``--distributed`` lets
``jax.distributed.initialize()`` detect the cluster, e.g. SLURM / Open MPI / Kubernetes;
``--coordinator HOST:PORT --num-processes N --process-id I`` sets it up by hand). Single-process
runs never call it.

The batch is split over every device (mesh axes ``('data', 'fsdp')``). With ``mesh.fsdp = 1``
parameters and optimizer state are replicated (plain data parallelism: XLA all-reduces the
gradients). With ``mesh.fsdp = F > 1`` every large array of the train state (parameters and the
Adam moments shaped like them) is split F ways along its largest dimension that F divides
(:func:`leaf_spec`); XLA all-gathers a parameter where it is used and reduce-scatters its
gradient. Small arrays (norm scales, biases, counters) stay replicated.
"""
from __future__ import annotations

import json

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from nsa_jax.config import Config, MeshConfig
from nsa_jax.parallel import BATCH_AXES   # the mesh's axes; batch rows are split over both
from nsa_jax.train.errors import TrainError

FSDP_MIN_SIZE = 1 << 14   # arrays with fewer elements stay replicated under FSDP


def init_distributed(auto: bool, coordinator: str | None, num_processes: int | None,
                     process_id: int | None) -> None:
    """Call ``jax.distributed.initialize`` for a multi-process launch (no-op otherwise)."""
    manual = (coordinator, num_processes, process_id)
    if not auto and all(v is None for v in manual):
        return
    if not auto and any(v is None for v in manual):
        raise TrainError("--coordinator, --num-processes and --process-id go together "
                         "(or use --distributed to detect the cluster)")
    try:
        if auto and all(v is None for v in manual):
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=num_processes, process_id=process_id)
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise TrainError(f"jax.distributed.initialize failed: {str(e).splitlines()[0]}") from None


def mesh_shape(mcfg: MeshConfig, n_devices: int) -> tuple[int, int]:
    fsdp = mcfg.fsdp
    if n_devices % fsdp:
        raise TrainError(f"mesh.fsdp: {fsdp} does not divide the device count {n_devices}")
    data = n_devices // fsdp if mcfg.data == -1 else mcfg.data
    if data * fsdp != n_devices:
        raise TrainError(f"mesh.data: data x fsdp = {data} x {fsdp} must equal the device count "
                         f"{n_devices}")
    return data, fsdp


def build_mesh(mcfg: MeshConfig, devices=None) -> jax.sharding.Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mcfg, len(devices))
    kwargs = {}
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is not None:   # jax >= 0.5: Auto axes (GSPMD propagation), same on 0.10 and 0.11
        kwargs["axis_types"] = (axis_type.Auto,) * len(BATCH_AXES)
    return jax.make_mesh(shape, BATCH_AXES, devices=devices, **kwargs)


def check_batch(cfg: Config, n_devices: int, n_processes: int) -> None:
    """The global batch, and each micro-batch, must split evenly over devices and processes."""
    t = cfg.train
    micro = t.batch_size // t.grad_accum
    if t.batch_size % n_devices:
        raise TrainError(f"train.batch_size: global batch {t.batch_size} is not divisible by the "
                         f"device count {n_devices}")
    if micro % n_devices:
        raise TrainError(f"train.grad_accum: micro-batch batch_size/grad_accum = {micro} is not "
                         f"divisible by the device count {n_devices}")
    if t.batch_size % n_processes:
        raise TrainError(f"train.batch_size: global batch {t.batch_size} is not divisible by the "
                         f"process count {n_processes}")


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def leaf_spec(shape, fsdp: int, min_size: int = FSDP_MIN_SIZE) -> P:
    """PartitionSpec of one state array under ``fsdp``-way sharding: its largest dimension that
    ``fsdp`` divides goes on the ``fsdp`` axis (the first such on ties); replicated when
    ``fsdp == 1``, when the array is smaller than ``min_size`` elements or no dimension fits."""
    size = int(np.prod(shape)) if len(shape) else 1
    if fsdp == 1 or size < min_size:
        return P()
    dims = [i for i, n in enumerate(shape) if n % fsdp == 0]
    if not dims:
        return P()
    best = max(dims, key=lambda i: (shape[i], -i))
    return P(*([None] * best + ["fsdp"]))


def param_shardings(mesh, params):
    """Sharding of every parameter: :func:`leaf_spec` on the mesh's ``fsdp`` axis."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda a: NamedSharding(mesh, leaf_spec(a.shape, fsdp)), params)


def state_shardings(mesh, abstract_state):
    """Shardings of the whole :class:`TrainState`: parameters per :func:`param_shardings`; the
    optimizer state by the same shape rule, so each Adam moment is split exactly like its
    parameter; the step, RNG and counters (scalars and tiny arrays) replicated."""
    return param_shardings(mesh, abstract_state)


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def place_batch(local, sharding: NamedSharding, global_rows: int):
    """This process's rows (an array, or a :class:`~nsa_jax.data.batch.Batch` of them) -> global
    arrays split over the batch axes, in the same structure."""
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        sharding, x, (global_rows,) + tuple(x.shape[1:])), local)


def gather_json(obj) -> list:
    """Every process's JSON-able ``obj``, in process order (no collective when single-process)."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    n = int(np.max(multihost_utils.process_allgather(np.array([raw.size], np.int32))))
    buf = np.zeros(n, np.uint8)
    buf[:raw.size] = raw
    allb = np.asarray(multihost_utils.process_allgather(buf)).reshape(jax.process_count(), n)
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in allb]
