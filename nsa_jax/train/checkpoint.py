"""Checkpoints: an orbax ``CheckpointManager`` under ``<run.dir>/checkpoints``.

Each step directory holds three items:

* ``params`` -- the model parameters (pure nested dict of float32 arrays);
* ``train``  -- optimizer state, step counter, RNG key and bad-step counters;
* ``meta``   -- JSON: step, tokens_seen, elapsed_s, the data loader position of every process
  (``loader.state()``), the resolved config and an exact checksum of every array
  (:mod:`nsa_jax.train.checksum`).

Saves are asynchronous (orbax copies the arrays to host memory, then writes in the background)
and atomic (a step is written under a temporary name and renamed when complete, so a killed
save is never listed; the next writer removes it). The manager keeps the newest
``train.ckpt_keep``; older ones are deleted only after a newer one is complete. A write that
fails (e.g. a full disk) raises :class:`WriteFailed` at the next save or wait.

Restoring checks shapes and checksums. :func:`newest_usable` walks from the newest step down: a
checkpoint that cannot be read back intact (:class:`CorruptCheckpoint`) is named in a warning and
the previous one is tried; :func:`quarantine` then moves the bad ones out of the way.
:func:`load_for_inference` restores the newest usable ``params`` into a fresh ``NSALM``.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Callable, TypeVar

import jax
import orbax.checkpoint as ocp
import yaml

from nsa_jax.config import Config, ConfigError, load_config
from nsa_jax.train.checksum import checksums, first_mismatch
from nsa_jax.train.errors import CheckpointError, CorruptCheckpoint, WriteFailed
from nsa_jax.train.files import os_reason
from nsa_jax.train.optim import path_str

T = TypeVar("T")

ITEMS = ("params", "train", "meta")
# Keys that choose how the same function is computed; a checkpoint may resume under others.
EXECUTION_ONLY_KEYS = frozenset({"model.nsa_impl", "model.dense_impl", "model.remat"})
_MISSING = "<missing>"


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def _handlers():
    return {"params": ocp.StandardCheckpointHandler(), "train": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler()}


@contextlib.contextmanager
def _absl_quiet(enabled: bool):
    log = logging.getLogger("absl")
    level = log.level
    if enabled:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _root_reason(e: BaseException) -> str:
    """The OSError's reason (e.g. ``No space left on device``) if one is in the chain."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.strerror:
            return os_reason(cur)
        cur = cur.__cause__ or cur.__context__
    return _first_line(e)


def _train_item(state) -> dict:
    return {"opt_state": state.opt_state, "step": state.step, "rng": state.rng,
            "bad_steps": state.bad_steps, "skipped": state.skipped}


def warn(msg: str) -> None:
    """One ``warning: ...`` line on stderr."""
    sys.stderr.write(f"warning: {msg}\n")
    sys.stderr.flush()


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` with the three items above."""

    def __init__(self, directory, keep: int | None = None, read_only: bool = False):
        self.dir = Path(directory).absolute()
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, read_only=read_only,
            save_interval_steps=0 if read_only else 1, enable_async_checkpointing=not read_only,
            cleanup_tmp_directories=not read_only)
        try:
            with _absl_quiet(read_only):   # orbax warns that a read-only manager is read-only
                self.mgr = ocp.CheckpointManager(self.dir, item_handlers=_handlers(),
                                                 options=opts)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{self.dir}: cannot open checkpoints ({_first_line(e)})") from None
        self._pending: int | None = None

    def steps(self) -> list[int]:
        return sorted(self.mgr.all_steps())

    def latest_step(self) -> int | None:
        s = self.steps()
        return s[-1] if s else None

    def step_dir(self, step: int) -> Path:
        return self.dir / str(step)

    # ---- save ------------------------------------------------------------------------------
    def save(self, step: int, state, meta: dict) -> None:
        """Start writing ``step`` (returns once the arrays are copied); ``meta`` gets the
        checksums. Raises :class:`WriteFailed` if this or the previous write failed."""
        train = _train_item(state)
        meta = {**meta, "checksums": {"params": checksums(state.params),
                                      "train": checksums(train)}}
        try:
            self.mgr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(state.params), train=ocp.args.StandardSave(train),
                meta=ocp.args.JsonSave(meta)), force=True)
        except Exception as e:  # noqa: BLE001 - e.g. a full disk
            failed = self._pending if self._pending not in (None, step) else step
            self._pending = None
            raise self._write_failed(failed, e) from e
        self._pending = step

    def _write_failed(self, step: int, e: BaseException) -> WriteFailed:
        reason = _root_reason(e)
        if len(reason) > 200:
            reason = reason[:200] + "..."
        return WriteFailed(f"checkpoint step {step}: cannot write {self.step_dir(step)} "
                           f"({reason})")

    def wait(self) -> None:
        """Block until the write in flight is complete; :class:`WriteFailed` if it failed."""
        try:
            self.mgr.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            step, self._pending = self._pending, None
            raise self._write_failed(step if step is not None else -1, e) from e
        self._pending = None

    def close(self) -> None:
        self.mgr.close()

    # ---- restore ---------------------------------------------------------------------------
    def read_meta(self, step: int) -> dict:
        try:
            meta = self.mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{self.step_dir(step)}: unreadable checkpoint "
                                    f"({_first_line(e)})") from None
        if not isinstance(meta, dict) or "step" not in meta:
            raise CorruptCheckpoint(f"{self.step_dir(step)}/meta: not a checkpoint of this "
                                    f"trainer")
        if meta["step"] != step:
            raise CorruptCheckpoint(f"{self.step_dir(step)}/meta: records step "
                                    f"{meta['step']!r}, expected {step}")
        return meta

    def _verify(self, step: int, item: str, meta: dict | None, tree) -> None:
        stored = ((meta or {}).get("checksums") or {}).get(item)
        if stored is None:          # written before checksums existed
            return
        bad = first_mismatch(stored, tree)
        if bad is not None:
            raise CorruptCheckpoint(f"{self.step_dir(step)}/{item}: {bad} does not match its "
                                    f"checksum (corrupted files)")

    def _check_shapes(self, step: int, item: str, abstract) -> None:
        """Name the first leaf whose stored shape/dtype differs from ``abstract``."""
        try:
            md = self.mgr.item_metadata(step)[item]
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{self.step_dir(step)}/{item}: unreadable checkpoint "
                                    f"({_first_line(e)})") from None
        if md is None:
            raise CorruptCheckpoint(f"{self.step_dir(step)}/{item}: missing from the "
                                    f"checkpoint")
        stored = {path_str(p): m for p, m in
                  jax.tree_util.tree_flatten_with_path(getattr(md, "tree", md))[0]}
        want = {path_str(p): a for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]}
        for k in want:
            if k not in stored:
                raise CheckpointError(f"{self.step_dir(step)}/{item}: has no entry {k} "
                                      f"(checkpoint from a different model)")
            s, a = stored[k], want[k]
            if tuple(getattr(s, "shape", ())) != tuple(a.shape) or (
                    getattr(s, "dtype", None) is not None and s.dtype != a.dtype):
                raise CheckpointError(f"{self.step_dir(step)}/{item}: {k} is "
                                      f"{getattr(s, 'dtype', '?')}{list(getattr(s, 'shape', ()))}"
                                      f", the model needs {a.dtype}{list(a.shape)}")
        extra = sorted(set(stored) - set(want))
        if extra:
            raise CheckpointError(f"{self.step_dir(step)}/{item}: unexpected entry {extra[0]} "
                                  f"(checkpoint from a different model)")

    def restore_params(self, step: int, abstract_params, meta: dict | None = None):
        """``abstract_params``: ShapeDtypeStructs with ``sharding`` (the restore target).
        With ``meta`` (from :meth:`read_meta`) the checksums are verified."""
        self._check_shapes(step, "params", abstract_params)
        try:
            params = self.mgr.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params))).params
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{self.step_dir(step)}/params: cannot restore "
                                    f"({_first_line(e)})") from None
        self._verify(step, "params", meta, params)
        return params

    def restore_state(self, step: int, abstract, meta: dict | None = None):
        """Full :class:`TrainState` shaped (and sharded) like ``abstract``; with ``meta`` the
        checksums are verified."""
        from nsa_jax.train.state import TrainState

        train_abs = _train_item(abstract)
        self._check_shapes(step, "params", abstract.params)
        self._check_shapes(step, "train", train_abs)
        try:
            r = self.mgr.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract.params),
                train=ocp.args.StandardRestore(train_abs)))
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{self.step_dir(step)}: cannot restore "
                                    f"({_first_line(e)})") from None
        self._verify(step, "params", meta, r.params)
        self._verify(step, "train", meta, r.train)
        t = r.train
        return TrainState(step=t["step"], params=r.params, opt_state=t["opt_state"], rng=t["rng"],
                          bad_steps=t["bad_steps"], skipped=t["skipped"])


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
    more = f"; the {len(bad) - 1} older one(s) are unusable too" if len(bad) > 1 else ""
    raise CheckpointError(f"{ck.dir}: no usable checkpoint: {first}{more}")


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
    """First ``section.key`` of model/nsa where ``saved`` (a config dict) differs from ``cfg``."""
    cur = cfg.to_dict()
    for sec in ("model", "nsa"):
        old = saved.get(sec) or {}
        if not isinstance(old, dict):
            return f"{sec}: saved section is not a mapping"
        for k in sorted(set(old) | set(cur[sec])):
            key = f"{sec}.{k}"
            if key in EXECUTION_ONLY_KEYS:
                continue
            a, b = old.get(k, _MISSING), cur[sec].get(k, _MISSING)
            if _norm(a) != _norm(b):
                return f"{key}: the checkpoint was trained with {key}={a!r}, this config has {b!r}"
    return None


def read_saved_config(path: Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{path}: cannot read the saved config ({_first_line(e)})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: the saved config is not a mapping")
    return raw


def check_compatible(run_dir, cfg: Config, meta: dict | None = None) -> None:
    """Refuse a resume whose model/nsa sections differ from the run's saved ``config.yaml``."""
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


# ---- inference -----------------------------------------------------------------------------
def load_for_inference(run_dir, step: int | None = None):
    """``(Config, NSALM)`` from a run directory: its ``config.yaml`` and newest (or ``step``)
    checkpoint's parameters, on the first local device. Raises :class:`CheckpointError` naming
    the path when something is missing or does not match."""
    from nsa_jax.train.state import ModelSpec

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: not found (is {run_dir} a training run directory?)")
    try:
        cfg = load_config(cfg_path)
    except ConfigError as e:
        raise CheckpointError(str(e) if str(cfg_path) in str(e) else f"{cfg_path}: {e}") from None
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
        spec = ModelSpec(cfg.model, cfg.nsa, cfg.train.seed)
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                              spec.abstract_params)

        def load(s):
            return ck.restore_params(s, target, ck.read_meta(s))

        # the newest usable one (with a warning for each bad one), or exactly ``step``
        _, params, _ = newest_usable(ck, load, steps if step is None else [step])
    finally:
        ck.close()
    return cfg, spec.model(params)
