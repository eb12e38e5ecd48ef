"""The run directory at start-up (first process only): created, unusable checkpoints moved aside,
``config.yaml`` (the resolved config), ``env.json`` and a copy of a ``data.tokenizer`` file
written, ``metrics.jsonl`` cut back to the
starting step and TensorBoard opened. Every failure is a :class:`TrainError` naming the path.

A fresh run that fails before it has a record of any step (:func:`is_new_run_dir`,
:func:`remove_start_outputs`) takes those start-up files away again, and the run directory when
this invocation created it: nothing half-written is left behind."""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import yaml

from nsa_jax.errors import os_reason, warn
from nsa_jax.train.env import collect_env
from nsa_jax.train.errors import TrainError
from nsa_jax.train.files import atomic_write_text
from nsa_jax.train.metrics import MetricsLog, TensorBoardWriter
from nsa_jax.train.recovery import quarantine


def open_outputs(start, argv) -> tuple[MetricsLog, TensorBoardWriter | None]:
    """The run's metrics log and TensorBoard writer (None on processes other than the first)."""
    run_dir, cfg = start.run_dir, start.cfg
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainError(f"run.dir: cannot create {run_dir} ({os_reason(e)})") from None
    resolved = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
    metrics, tb = MetricsLog(run_dir / "metrics.jsonl"), None
    if start.primary:
        _quarantine(start)
        _write(run_dir / "config.yaml", lambda p: atomic_write_text(
            p, yaml.safe_dump(resolved.to_dict(), sort_keys=False)))
        _write(run_dir / "env.json", lambda p: atomic_write_text(
            p, json.dumps(collect_env(argv), indent=2) + "\n"))
        _copy_tokenizer(cfg.data.tokenizer, run_dir / RUN_TOKENIZER)
        _write(metrics.path, lambda p: metrics.truncate_after(start.step))
        # drops TensorBoard events of an earlier, interrupted attempt from this step on
        tb = _write(run_dir / "tensorboard", lambda p: TensorBoardWriter(
            p, restart_step=start.step + 1))
    if start.nproc > 1 and start.bad_steps:      # the moves are done before anyone writes
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("nsa_jax.train quarantine")
    return metrics, tb


RUN_TOKENIZER = "tokenizer.json"   # a copy of a data.tokenizer file, read by load_run


def _copy_tokenizer(name: str, dst) -> None:
    """A ``data.tokenizer`` given as a tokenizer.json path is copied into the run directory:
    ``config.yaml`` keeps the path as given (perhaps relative to the directory training started
    in), and the run's copy lets :func:`nsa_jax.inference.load_run` find it from anywhere, also
    after the run directory moves (forty-sixth session's review). The named tokenizers
    (``gpt2``, ``byte``) ship with the package."""
    if name in ("gpt2", "byte"):
        return
    from nsa_jax.data.paths import resolve_path

    src = resolve_path(name)
    if src.is_file():
        _write(dst, lambda p: atomic_write_text(p, src.read_text(encoding="utf-8")))


# ---- a fresh run that failed before its first step ----------------------------------------
START_FILES = ("config.yaml", "env.json", RUN_TOKENIZER, "heartbeat.json", "metrics.jsonl")
# written at start-up (here, and by the Watchdog) before a step is on record; with the empty
# checkpoints/ (the Checkpointer) and tensorboard/ (a SessionLog.START event)


def is_new_run_dir(start) -> bool:
    """Whether this invocation is about to create ``run.dir`` (call it before
    :func:`open_outputs`) for a fresh run of one process: only such a directory's start-up files
    may be removed by :func:`remove_start_outputs`. A resumed run, a directory that exists
    already (made by hand or by an earlier attempt) and a multi-process run (the directory is
    shared) are never touched."""
    return start.nproc == 1 and not start.resumed and not Path(start.run_dir).exists()


def has_record(run_dir) -> bool:
    """Whether ``run_dir`` holds a record of training: anything under ``checkpoints/`` (a
    checkpoint, or one being written), a metrics line, or a ``corrupt_checkpoints/``."""
    run_dir = Path(run_dir)
    ck, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"
    return ((ck.is_dir() and any(ck.iterdir())) or (run_dir / "corrupt_checkpoints").exists()
            or (metrics.is_file() and metrics.stat().st_size > 0))


def remove_start_outputs(run_dir) -> str | None:
    """After a fresh run in a directory it created (:func:`is_new_run_dir`) failed before any
    step was on record (:func:`has_record`): remove the files it wrote at start-up
    (:data:`START_FILES`, their ``.tmp`` siblings, TensorBoard's event files, the empty
    ``checkpoints/`` and ``tensorboard/``), then ``run_dir`` itself if that left it empty.
    Anything else -- a ``stacks.txt`` dump, a ``profile/`` trace -- stays, and so does the
    directory holding it. Returns the note for the error message, or None where the directory
    holds a record (then nothing is removed) or is gone. Never raises: the error being reported
    matters more than the clean-up."""
    run_dir = Path(run_dir)
    try:
        if not run_dir.is_dir() or has_record(run_dir):
            return None
        names = [*START_FILES, *(f"{n}.tmp" for n in START_FILES)]
        files = [*(run_dir / n for n in names),
                 *(run_dir / "tensorboard").glob("events.out.tfevents.*")]
    except OSError:
        return None
    for path in files:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    for d in (run_dir / "checkpoints", run_dir / "tensorboard", run_dir):
        with contextlib.suppress(OSError):
            d.rmdir()                            # only when empty
    if not run_dir.exists():
        return f"removed the new run directory {run_dir}"
    try:
        left = ", ".join(sorted(p.name for p in run_dir.iterdir()))
    except OSError:
        left = "?"
    return f"removed the files this run wrote to {run_dir} (kept: {left})"


def _quarantine(s) -> None:
    if not s.bad_steps:
        return
    try:
        moved = quarantine(s.ck_dir, list(s.bad_steps), s.run_dir)
    except OSError as e:
        raise TrainError(f"run.dir: cannot move the unusable checkpoints out of "
                         f"{s.ck_dir} ({os_reason(e)})") from None
    for path in moved:
        warn(f"moved the unusable checkpoint {s.ck_dir / path.name.split('-')[0]} to {path}")


def _write(path, write):
    try:
        return write(path)
    except OSError as e:
        raise TrainError(f"run.dir: cannot write {path} ({os_reason(e)})") from None
