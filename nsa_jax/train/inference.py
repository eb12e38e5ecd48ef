"""Weights of a trained run for generation: :func:`restore_for_inference` (config, model and
the step it came from) and :func:`load_for_inference` (config and model)."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax

from nsa_jax.config import Config, ConfigError, load_config
from nsa_jax.errors import warn
from nsa_jax.train.checkpoint import Checkpointer, checkpoint_dir
from nsa_jax.train.errors import CheckpointError
from nsa_jax.train.recovery import newest_usable


class InferenceCheckpoint(NamedTuple):
    cfg: Config
    model: object      # nsa_jax.model.NSALM
    step: int          # the checkpoint step loaded (older than the newest after a fall-back)


def restore_for_inference(run_dir, step: int | None = None) -> InferenceCheckpoint:
    """``(Config, NSALM, step)`` from a run directory: its ``config.yaml`` and newest (or ``step``)
    checkpoint's parameters, on the first local device. Raises :class:`CheckpointError` naming
    the path when something is missing or does not match."""
    from nsa_jax.train.state import ModelSpec

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: not found (is {run_dir} a training run directory?)")
    notes: list[str] = []
    try:
        cfg = load_config(cfg_path, notes=notes)
    except ConfigError as e:
        raise CheckpointError(str(e) if str(cfg_path) in str(e) else f"{cfg_path}: {e}") from None
    for note in notes:           # keys that moved, as the train CLI says them
        warn(note)
    ck_dir = checkpoint_dir(run_dir)
    if not ck_dir.is_dir():
        raise CheckpointError(f"{ck_dir}: no checkpoints directory")
    ck = Checkpointer(ck_dir, read_only=True)
    try:
        steps = ck.steps()
        if not steps:
            raise CheckpointError(f"{ck_dir}: no checkpoint")
        if step is not None and step not in steps:
            raise CheckpointError(f"{ck_dir}: no checkpoint for step {step} (have {steps})")
        spec = ModelSpec(cfg.model, cfg.nsa, cfg.train.seed, cfg.exec)
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                              spec.abstract_params)

        def load(s):
            return ck.restore_params(s, target, ck.read_meta(s))

        # the newest usable one (with a warning for each bad one), or exactly ``step``
        loaded, params, _ = newest_usable(ck, load, steps if step is None else [step])
    finally:
        ck.close()
    return InferenceCheckpoint(cfg, spec.model(params), loaded)


def load_for_inference(run_dir, step: int | None = None):
    """``(Config, NSALM)``: :func:`restore_for_inference` without the step."""
    cfg, model, _ = restore_for_inference(run_dir, step)
    return cfg, model
