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

Restoring checks shapes and checksums; a checkpoint that cannot be read back intact raises
:class:`CorruptCheckpoint` (one line, the innermost reason). Choosing among checkpoints (fall
back past corrupt ones, move them aside, the config check) is :mod:`nsa_jax.train.recovery`;
restoring weights for generation is :mod:`nsa_jax.train.inference` (``load_for_inference`` is
also importable from here).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from nsa_jax.errors import quiet_orbax_reads, root_reason, warn  # noqa: F401 (warn: re-export)
from nsa_jax.train.checksum import checksums, first_mismatch
from nsa_jax.train.errors import CheckpointError, CorruptCheckpoint, WriteFailed
from nsa_jax.train.optim import path_str

ITEMS = ("params", "train", "meta")


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


def _reason(e: BaseException) -> str:
    """The innermost cause of a failed orbax call, short; the tasks orbax left behind for it
    are collected now, while their noise is filtered (:func:`quiet_orbax_reads`; the
    "coroutine ... was never awaited" warnings of the reads it abandoned, which Python issues
    during this collection, as well)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                                category=RuntimeWarning)
        gc.collect()
    return root_reason(e)


def _train_item(state) -> dict:
    return {"opt_state": state.opt_state, "step": state.step, "rng": state.rng,
            "bad_steps": state.bad_steps, "skipped": state.skipped}


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` with the three items above."""

    def __init__(self, directory, keep: int | None = None, read_only: bool = False):
        quiet_orbax_reads()
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
            raise CheckpointError(f"{self.dir}: cannot open checkpoints ({_reason(e)})") from None
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
        reason = root_reason(e)
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
                                    f"({_reason(e)})") from None
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
                                    f"({_reason(e)})") from None
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
                                    f"({_reason(e)})") from None
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
                                    f"({_reason(e)})") from None
        self._verify(step, "params", meta, r.params)
        self._verify(step, "train", meta, r.train)
        t = r.train
        return TrainState(step=t["step"], params=r.params, opt_state=t["opt_state"], rng=t["rng"],
                          bad_steps=t["bad_steps"], skipped=t["skipped"])




def __getattr__(name):   # moved to nsa_jax.train.inference; still importable from here
    if name in ("load_for_inference", "restore_for_inference"):
        from nsa_jax.train import inference
        return getattr(inference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
