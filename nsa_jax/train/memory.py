"""Out-of-memory errors of training, told apart from bugs and explained in one line.

XLA reports an allocation it cannot make as ``jax.errors.JaxRuntimeError`` (``XlaRuntimeError``
in older jaxlibs) whose message starts ``RESOURCE_EXHAUSTED`` -- on the CPU reference path too,
e.g. ``data.seq_len=100000``: ``RESOURCE_EXHAUSTED: Out of memory allocating 7052732239744
bytes.``; host code (numpy, the data pipeline) raises ``MemoryError``. Before this module the CLI
reported either as an ``internal error``. :func:`is_out_of_memory` recognises them and
:func:`out_of_memory` turns one into an :class:`~nsa_jax.train.errors.OutOfMemory` whose message
names what ran out, the device, where the run was, and the config keys that drive memory (the
CLI exits with :data:`~nsa_jax.train.errors.EXIT_OUT_OF_MEMORY`).
"""
from __future__ import annotations

import re

from nsa_jax.errors import MAX_REASON, byte_size
from nsa_jax.train.errors import OutOfMemory

_XLA_ERRORS = ("JaxRuntimeError", "XlaRuntimeError")   # the class's name across jaxlib releases


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is an allocation that failed: a
    ``MemoryError``, or an XLA runtime error saying ``RESOURCE_EXHAUSTED`` / out of memory."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MemoryError):
            return True
        if type(cur).__name__ in _XLA_ERRORS:
            text = str(cur)
            if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
                return True
        cur = cur.__cause__ or cur.__context__
    return False


def out_of_memory(e: BaseException, cfg, where: str, note: str = "") -> OutOfMemory:
    """The one-line :class:`OutOfMemory` for ``e``: ``out of memory on <device> <where>:
    <XLA's reason>; <the keys to change>[; note]``."""
    msg = f"out of memory on {device_memory()} {where}: {_reason(e)}; {memory_hint(cfg)}"
    return OutOfMemory(f"{msg}; {note}" if note else msg)


def device_memory() -> str:
    """What ran out: ``the cpu (host RAM)``, or e.g. ``gpu NVIDIA H200 (device memory)``."""
    try:
        import jax

        d = jax.local_devices()[0]
    except Exception:  # noqa: BLE001 - the message must not fail
        return "the device"
    if d.platform == "cpu":
        return "the cpu (host RAM)"
    return f"{d.platform} {d.device_kind} (device memory)"


def memory_hint(cfg) -> str:
    """The config keys that drive training memory, with their values and which way to turn
    them: activations grow with ``data.seq_len`` x the micro-batch (``train.batch_size`` /
    ``train.grad_accum``); ``exec.remat=block`` recomputes each block's activations."""
    d, t = cfg.data, cfg.train
    micro = t.batch_size // t.grad_accum
    fixes = [f"lower data.seq_len (now {d.seq_len}) or train.batch_size (now {t.batch_size})"]
    if micro > 1:
        fixes.append(f"raise train.grad_accum (now {t.grad_accum}: micro-batches of "
                     f"{micro} sequences)")
    if getattr(getattr(cfg, "exec", None), "remat", None) == "none":
        fixes.append("set exec.remat=block (recompute activations in the backward pass)")
    tail = fixes[-1] if len(fixes) == 1 else f"{', '.join(fixes[:-1])} or {fixes[-1]}"
    return f"memory grows with data.seq_len x the micro-batch: {tail}"


def _reason(e: BaseException) -> str:
    """XLA's first line (``RESOURCE_EXHAUSTED: Out of memory allocating N bytes.``) with the
    size in GiB, or ``MemoryError: ...``; at most :data:`~nsa_jax.errors.MAX_REASON` chars."""
    text = str(e).strip()
    line = text.splitlines()[0].strip() if text else ""
    if isinstance(e, MemoryError) or not line:
        line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    m = re.search(r"(\d{4,}) bytes", line)
    if m:
        line = line.rstrip(".") + f" ({byte_size(int(m.group(1)))})"
    return line if len(line) <= MAX_REASON else line[:MAX_REASON - 3] + "..."

