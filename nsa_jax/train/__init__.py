"""Training system: ``python -m nsa_jax.train --config configs/X.yaml [key=value ...]``.

Modules, one concern each: ``cli`` (arguments, error lines, exit codes), ``loop`` (checks, then
the training loop), ``start`` (every input checked, the starting point loaded), ``outputs`` (the
run directory at start-up), ``hooks`` (profiler, reporter, evaluator, bad-step guard, checkpoint
policy), ``step`` (jitted train/eval steps), ``optim`` (AdamW, schedule, decay mask), ``state``
(train state, params <-> NSALM), ``mesh`` (devices, shardings, multi-process), ``checkpoint``
(orbax manager), ``recovery`` (resume with fall-back past corrupt checkpoints), ``checksum``
(exact array checksums in each checkpoint), ``inference`` (``load_for_inference``), ``metrics``
(jsonl, TensorBoard, log lines), ``env`` (env.json), ``feed`` (bounded waits for batches, data
failures), ``memory`` (out-of-memory errors explained), ``signals`` (SIGTERM/SIGINT: checkpoint
and exit 0), ``watchdog`` (heartbeat, SIGUSR1 stacks, hang abort), ``files`` (atomic small
files), ``errors`` (exceptions and their exit statuses). The progress display is
:mod:`nsa_jax.progress`.

    from nsa_jax.train import load_for_inference
    cfg, model = load_for_inference("runs/tiny-20250101-120000")
"""
from __future__ import annotations

__all__ = ["load_for_inference", "restore_for_inference", "train", "CheckpointError", "CorruptCheckpoint", "DataFailed",
           "OutOfMemory", "TrainError", "TrainingFailed", "WriteFailed"]


def __getattr__(name):  # keep `python -m nsa_jax.train --help` free of jax imports
    if name in ("load_for_inference", "restore_for_inference"):
        from nsa_jax.train import inference
        return getattr(inference, name)
    if name == "train":
        from nsa_jax.train.loop import train
        return train
    if name in ("CheckpointError", "CorruptCheckpoint", "DataFailed", "OutOfMemory", "TrainError",
                "TrainingFailed", "WriteFailed"):
        from nsa_jax.train import errors
        return getattr(errors, name)
    raise AttributeError(f"module 'nsa_jax.train' has no attribute {name!r}")
