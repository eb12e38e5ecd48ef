"""Liveness: a heartbeat file, stack dumps on demand, and ``run.watchdog_s`` for hung runs.

* **Heartbeat.** :meth:`Watchdog.beat` is called after every step, eval batch and checkpoint;
  it rewrites ``<run.dir>/heartbeat.json`` (``heartbeat.<i>.json`` for process ``i > 0``)
  with ``{"pid", "step", "where", "time"}`` (``time``: Unix seconds). A monitor can tell a
  live run from a hung one by its age. The record is one ``pwrite`` of a fixed-width,
  space-padded JSON line at offset 0 of a file kept open (~15 us; opening and renaming a file
  every step cost ~1 ms here), so a reader never sees a mix of two records.
* **Stacks on demand.** ``kill -USR1 <pid>`` appends every thread's Python stack to
  ``<run.dir>/stacks.txt`` (``stacks.<i>.txt``). It is ``faulthandler.register``: it works even
  while the main thread is stuck inside a device call or a collective.
* **Watchdog.** With ``run.watchdog_s > 0``, a thread checks the time since the last beat; after
  ``watchdog_s`` seconds without one it writes ``error: run.watchdog_s: no progress for ...`` and
  every thread's stack to stderr and to the stacks file, then ends the process with status 3.
  Checkpoints already written stay valid; resume from the newest one.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from nsa_jax.errors import EXIT_HUNG, os_reason
from nsa_jax.train.errors import WriteFailed


def _name(stem: str, ext: str, process_index: int) -> str:
    return f"{stem}.{ext}" if process_index == 0 else f"{stem}.{process_index}.{ext}"


class Watchdog:
    def __init__(self, timeout_s: float, run_dir=None, process_index: int = 0,
                 armed: bool = True):
        self.timeout_s = timeout_s
        self.where = "start"
        self.step: int | None = None
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = None
        self.heartbeat_path = self.stacks_path = None
        self._stacks = None
        self._hb_fd, self._hb_width = None, 160
        if run_dir is not None:
            run_dir = Path(run_dir)
            self.heartbeat_path = run_dir / _name("heartbeat", "json", process_index)
            self.stacks_path = run_dir / _name("stacks", "txt", process_index)
            for path in (self.heartbeat_path, self.stacks_path):
                try:
                    if path == self.heartbeat_path:
                        self._hb_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    else:
                        self._stacks = open(path, "a")
                except OSError as e:
                    self.close()
                    raise WriteFailed(f"run.dir: cannot write {path} ({os_reason(e)})") from e
            if hasattr(signal, "SIGUSR1"):
                faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        self.beat("start")
        if armed:
            self.arm()

    def arm(self) -> None:
        """Start counting (the loop arms it after compilation, which may take long)."""
        self._last = time.monotonic()
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nsa-watchdog", daemon=True)
            self._thread.start()

    def beat(self, where: str = "", step: int | None = None) -> None:
        """Progress was made (``where``: e.g. ``step 12``); rewrites the heartbeat file."""
        self._last = time.monotonic()
        if where:
            self.where = where
        if step is not None:
            self.step = step
        if self._hb_fd is not None:
            text = json.dumps({"pid": os.getpid(), "step": self.step, "where": self.where,
                               "time": round(time.time(), 3)})
            self._hb_width = max(self._hb_width, len(text) + 1)
            try:
                os.pwrite(self._hb_fd, (text.ljust(self._hb_width - 1) + "\n").encode(), 0)
            except OSError as e:
                raise WriteFailed(f"run.dir: cannot write {self.heartbeat_path} "
                                  f"({os_reason(e)})") from e

    def dump_stacks(self, header: str) -> None:
        """``header`` and every thread's stack to stderr and (if any) the stacks file."""
        for f in (sys.stderr, self._stacks):
            if f is None:
                continue
            try:
                f.write(header + "\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.flush()
            except (OSError, ValueError):   # a full disk must not stop the abort
                pass

    def _run(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                where = f" (also in {self.stacks_path})" if self.stacks_path else ""
                self.dump_stacks(f"error: run.watchdog_s: no progress for {idle:.0f}s (last: "
                                 f"{self.where}); aborting; the stacks of all threads "
                                 f"follow{where}")
                os._exit(EXIT_HUNG)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._stacks is not None:
            if hasattr(signal, "SIGUSR1"):
                faulthandler.unregister(signal.SIGUSR1)
            self._stacks.close()
            self._stacks = None
            with contextlib.suppress(OSError):   # kept only when stacks were dumped into it
                if self.stacks_path.stat().st_size == 0:
                    self.stacks_path.unlink()
        if self._hb_fd is not None:
            os.close(self._hb_fd)
            self._hb_fd = None
