"""Exceptions of the training system.

:class:`TrainError` is bad input (a run directory, checkpoint or device layout that does not fit
the config): the CLI prints its one-line message as ``error: ...`` and exits with status 2,
before any compute. :class:`TrainingFailed` is a failure while training (e.g. too many
non-finite steps): ``error: ...`` and status 1.
"""
from __future__ import annotations


class TrainError(ValueError):
    """Bad input; the message is one line naming the config key or path."""


class CheckpointError(TrainError):
    """A missing, unreadable or incompatible checkpoint; the message names the path."""


class TrainingFailed(RuntimeError):
    """Training started but cannot continue (non-finite steps, watchdog); one-line message."""
