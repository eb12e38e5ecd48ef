"""Choosing the checkpoint to continue from, and checking it fits the config.

* :func:`newest_usable` walks from the newest step down: a checkpoint that cannot be read back
  intact (:class:`CorruptCheckpoint`) is named in a warning and the previous one is tried. When
  none is usable it raises :class:`NoUsableCheckpoint`, one line naming every bad step.
* :func:`quarantine` moves unusable step directories to ``<run.dir>/corrupt_checkpoints/``.
* :func:`check_compatible` refuses a checkpoint whose ``model``/``nsa`` sections (what fixes the
  parameter shapes) or data-stream keys (:data:`~nsa_jax.config.DATA_STREAM_KEYS`: what fixes
  the tokens its saved data position points into) differ from this config's.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, TypeVar

import yaml

from nsa_jax.config import DATA_STREAM_KEYS, SECTIONS, SHAPE_SECTIONS, Config, migrate
from nsa_jax.errors import first_line, warn
from nsa_jax.train.checkpoint import Checkpointer, checkpoint_dir
from nsa_jax.train.errors import CheckpointError, CorruptCheckpoint

T = TypeVar("T")
_MISSING = "<missing>"


class NoUsableCheckpoint(CheckpointError):
    """Every checkpoint of a run is corrupt; ``bad_steps`` lists them, newest first."""

    def __init__(self, msg: str, bad_steps: list[int]):
        super().__init__(msg)
        self.bad_steps = bad_steps


# ---- choosing a checkpoint -----------------------------------------------------------------
def newest_usable(ck: Checkpointer, load: Callable[[int], T], steps: list[int] | None = None,
                  say: Callable[[str], None] = warn) -> tuple[int, T, list[int]]:
    """``(step, load(step), bad_steps)`` for the newest step whose ``load`` succeeds.

    A :class:`CorruptCheckpoint` is reported through ``say`` (naming the bad step directory)
    and the next older step is tried; any other error propagates. Raises
    :class:`CheckpointError` (one line, no warnings) when no step loads."""
    steps = sorted(ck.steps() if steps is None else steps)
    bad, first, notes = [], None, []
    for step in reversed(steps):
        try:
            result = load(step)
        except CorruptCheckpoint as e:
            bad.append(step)
            first = first or e
            older = [s for s in steps if s < step]
            notes.append(f"{e}; " + (f"falling back to step {older[-1]}" if older
                                     else "no older checkpoint to fall back to"))
            continue
        for note in notes:
            say(note)
        return step, result, bad
    if first is None:
        raise CheckpointError(f"{ck.dir}: no checkpoint")
    more = (f"; the older one(s), step {', '.join(map(str, bad[1:]))}, are unusable too"
            if len(bad) > 1 else "")
    raise NoUsableCheckpoint(f"{ck.dir}: no usable checkpoint: {first}{more}", bad)


def quarantine(ck_dir, steps: list[int], run_dir) -> list[Path]:
    """Move the step directories ``steps`` to ``<run_dir>/corrupt_checkpoints/`` (kept for
    inspection, out of the manager's way). Returns the new paths."""
    out = []
    dest_root = Path(run_dir) / "corrupt_checkpoints"
    for step in steps:
        src = Path(ck_dir) / str(step)
        if not src.exists():
            continue
        dest_root.mkdir(exist_ok=True)
        dest, i = dest_root / str(step), 1
        while dest.exists():
            i += 1
            dest = dest_root / f"{step}-{i}"
        src.rename(dest)
        out.append(dest)
    return out


# ---- config compatibility ------------------------------------------------------------------
def _norm(v):
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return v


def config_mismatch(saved: dict, cfg: Config) -> str | None:
    """First ``section.key`` of model/nsa (:data:`~nsa_jax.config.SHAPE_SECTIONS`), then of the
    data stream (:data:`~nsa_jax.config.DATA_STREAM_KEYS`), where ``saved`` (a config dict,
    perhaps with keys that moved since) differs from ``cfg``. A data-stream key the saved config
    lacks (added since that run) counts as its default."""
    cur = cfg.to_dict()
    saved = migrate(saved)
    for sec in SHAPE_SECTIONS:
        old = saved.get(sec) or {}
        if not isinstance(old, dict):
            return f"{sec}: saved section is not a mapping"
        for k in sorted(set(old) | set(cur[sec])):
            key = f"{sec}.{k}"
            a, b = old.get(k, _MISSING), cur[sec].get(k, _MISSING)
            if _norm(a) != _norm(b):
                return f"{key}: the checkpoint was trained with {key}={a!r}, this config has {b!r}"
    defaults = {sec: dataclasses.asdict(SECTIONS[sec]())
                for sec in {key.split(".")[0] for key in DATA_STREAM_KEYS}}
    for key in DATA_STREAM_KEYS:
        sec, k = key.split(".")
        old = saved.get(sec) or {}
        a = old.get(k, defaults[sec].get(k, _MISSING)) if isinstance(old, dict) else _MISSING
        b = cur[sec].get(k, _MISSING)
        if _norm(a) != _norm(b):
            return (f"{key}: the run was trained with {key}={a!r}, this config has {b!r}; its "
                    f"saved data position points into that stream (pass the run's value to "
                    f"continue it; to go on with other data, start a new run.dir with "
                    f"train.init_from=<this run>)")
    return None


def read_saved_config(path: Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{path}: cannot read the saved config ({first_line(e)})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: the saved config is not a mapping")
    return raw


def check_compatible(run_dir, cfg: Config, meta: dict | None = None) -> None:
    """Refuse a resume whose model/nsa sections or data-stream keys differ from the run's saved
    ``config.yaml``."""
    path = Path(run_dir) / "config.yaml"
    if path.is_file():
        saved, where = read_saved_config(path), path
    elif meta is not None and isinstance(meta.get("config"), dict):
        saved, where = meta["config"], checkpoint_dir(run_dir)
    else:
        raise CheckpointError(f"{path}: missing; cannot check the checkpoint matches this config")
    diff = config_mismatch(saved, cfg)
    if diff:
        raise CheckpointError(f"incompatible checkpoint in {where}: {diff}")
