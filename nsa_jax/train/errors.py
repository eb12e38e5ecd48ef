"""Exceptions of the training system, and the exit status the CLI gives each.

* :class:`TrainError` (status 2) is bad input -- a run directory, checkpoint or device layout
  that does not fit the config; raised before any compute. :class:`CheckpointError` is one for a
  checkpoint; :class:`CorruptCheckpoint` one that cannot be read back (resume falls back to the
  previous checkpoint when it meets one).
* :class:`TrainingFailed` (status 1): training started but cannot continue -- too many
  non-finite steps, a data source that fails or stalls (:class:`DataFailed`, raised after a
  checkpoint of the last completed step was written), or run outputs that cannot be written
  (:class:`WriteFailed`, e.g. a full disk).
* :class:`OutOfMemory` (status 4, :data:`EXIT_OUT_OF_MEMORY`): an allocation failed (XLA's
  ``RESOURCE_EXHAUSTED``, ``MemoryError``); the message names the device and the config keys that
  drive memory (:mod:`nsa_jax.train.memory`).

Every message is one line naming the config key or path. Exit statuses and the helpers that
make one-line messages are in :mod:`nsa_jax.errors`, shared by every CLI.
"""
from __future__ import annotations

from nsa_jax.errors import EXIT_OUT_OF_MEMORY, one_line  # noqa: F401  (re-exported)


class TrainError(ValueError):
    """Bad input; the message is one line naming the config key or path."""


class CheckpointError(TrainError):
    """A missing, unreadable or incompatible checkpoint; the message names the path."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint whose files cannot be read back intact (truncated, garbled, checksum)."""


class TrainingFailed(RuntimeError):
    """Training started but cannot continue (non-finite steps, data, disk); one-line message."""


class DataFailed(TrainingFailed):
    """The data source raised (after its retries) or stalled during training."""


class WriteFailed(TrainingFailed):
    """A run output (checkpoint, metrics, heartbeat) could not be written, e.g. a full disk."""


class OutOfMemory(TrainingFailed):
    """An allocation failed (on the device or the host); the one-line message names the device
    and the config keys that drive memory (:func:`nsa_jax.train.memory.out_of_memory`)."""
