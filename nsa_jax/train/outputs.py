"""The run directory at start-up (first process only): created, unusable checkpoints moved aside,
``config.yaml`` (the resolved config), ``env.json`` and a copy of a ``data.tokenizer`` file
written, ``metrics.jsonl`` cut back to the
starting step and TensorBoard opened. Every failure is a :class:`TrainError` naming the path."""
from __future__ import annotations

import dataclasses
import json

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
