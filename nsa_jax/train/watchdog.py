"""Liveness: a heartbeat file, stack dumps on demand, and ``run.watchdog_s`` for hung runs.

* **Heartbeat.** :meth:`Watchdog.beat` is called after every step, eval batch and checkpoint;
  it rewrites ``<run.dir>/heartbeat.json`` (``heartbeat.<i>.json`` for process ``i > 0``)
  with ``{"pid", "step", "where", "time"}`` (``time``: Unix seconds). A monitor can tell a
  live run from a hung one by its age. The record is one ``pwrite`` of a fixed-width,
  space-padded JSON line at offset 0 of a file kept open (~15 us; opening and renaming a file
  every step cost ~1 ms here), so a reader never sees a mix of two records.
* **Stacks on demand.** ``kill -USR1 <pid>`` appends a ``stacks on SIGUSR1`` line and every
  thread's Python stack to ``<run.dir>/stacks.txt`` (``stacks.<i>.txt``); the run goes on. The
  signal only wakes a thread, ``nsa-stacks``, which takes every thread's current frame under
  the thread list's lock (``sys._current_frames``; ``faulthandler``'s dump takes no lock and
  crashed, see :func:`_format_stacks`) and then lists them in Python, so the stacks of one dump
  may be a few milliseconds apart. It works even while the main thread is
  stuck inside a call that released the GIL (a device call, a collective, I/O; not a C extension
  spinning with the GIL held, which no Python thread can outwait): Python's C-level handler, run
  by whichever thread the kernel picked, writes the signal number to a ``signal.set_wakeup_fd``
  pipe that the thread reads (a Python-level handler alone would wait for the main thread). The wakeup fd is one per
  process: one set before is kept, bytes forwarded to it, and :meth:`Watchdog.close` puts it and
  the previous SIGUSR1 handler back. Not used: ``faulthandler.register`` dumps from inside the
  signal handler without the GIL and crashed the run with SIGSEGV when another thread was running
  Python code at that moment; it is kept only where the pipe cannot be had (a ``Watchdog`` made
  outside the main thread). Blocking SIGUSR1 and ``signal.sigwait`` in one thread does not work
  either: threads started before (jax/XLA's) leave it unblocked, and the kernel hands it to them.
* **Watchdog.** With ``run.watchdog_s > 0``, a thread checks the time since the last beat; after
  ``watchdog_s`` seconds without one it writes ``error: run.watchdog_s: no progress for ...`` and
  every thread's stack to the stacks file and to stderr, then ends the process with status 3,
  also when stderr itself is what hangs (:meth:`Watchdog._abort_dump`). Checkpoints already
  written stay valid; resume from the newest one.
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


ABORT_STDERR_S = 5.0    # how long the watchdog's abort waits for its stderr dump


def _name(stem: str, ext: str, process_index: int) -> str:
    return f"{stem}.{ext}" if process_index == 0 else f"{stem}.{process_index}.{ext}"


def _format_stacks() -> str:
    """Every Python thread's stack, innermost frame first, in ``faulthandler``'s layout (plus
    each thread's name). Read with ``sys._current_frames``, which holds the GIL and the thread
    list's lock: ``faulthandler.dump_traceback(all_threads=True)`` walks that list without the
    lock and crashed with SIGSEGV (CI, and ``tests/test_watchdog.py``) when a thread outside
    Python (an XLA thread calling back into Python) was given its thread state at that moment,
    because a new state is listed before it is filled in. Frames are walked by hand: no source
    lines, no ``linecache`` (whose cache other threads may change meanwhile)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        name = f' "{names[ident]}"' if ident in names else ""
        out.append(f"\n{'Current thread' if ident == me else 'Thread'} 0x{ident:016x}{name} "
                   "(most recent call first):")
        while frame is not None:
            code = frame.f_code
            out.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame = frame.f_back
    return "\n".join(out) + "\n"


def _dump(f, header: str) -> None:
    """``header`` and every thread's stack to the file ``f``."""
    try:
        f.write(header + "\n")
        f.flush()
        f.write(_format_stacks())
        f.flush()
    except (OSError, ValueError):   # a full disk must not stop the abort
        pass


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
        self._stacks_lock = threading.Lock()      # one dump at a time into the stacks file
        self._signal_hooks: list = []             # fn(signum) per byte read by nsa-stacks
        self._usr1 = None      # "faulthandler", or (thread, read fd, write fd, previous handler,
        #                        previous wakeup fd) for the nsa-stacks thread
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
                self._listen_usr1()
        try:
            self.beat("start")
        except WriteFailed:
            self.close()        # the handler, wakeup fd, pipe and thread go back with the files
            raise
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

    def dump_stacks(self, header: str, stderr: bool = True) -> None:
        """``header`` and every thread's stack to stderr (unless ``stderr=False``) and (if any)
        the stacks file (:func:`_format_stacks`: one snapshot of the current frames, listed in
        Python while other threads may move on)."""
        if stderr:
            _dump(sys.stderr, header)
        with self._stacks_lock:
            if self._stacks is not None:
                _dump(self._stacks, header)

    def _listen_usr1(self) -> None:
        """SIGUSR1 -> a dump by the ``nsa-stacks`` thread (module docstring); where that cannot be
        set up, ``faulthandler.register`` as before."""
        if threading.current_thread() is threading.main_thread():   # signal.signal's rule
            with contextlib.suppress(OSError):
                r, w = os.pipe()
                try:
                    os.set_blocking(w, False)    # set_wakeup_fd's rule; the reader blocks
                    prev_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
                    try:
                        prev_handler = signal.signal(signal.SIGUSR1, self._on_usr1)
                    except (OSError, ValueError):
                        signal.set_wakeup_fd(prev_fd)
                        raise
                except (OSError, ValueError):
                    os.close(r)
                    os.close(w)
                else:
                    thread = threading.Thread(target=self._usr1_loop, args=(r, prev_fd),
                                              name="nsa-stacks", daemon=True)
                    thread.start()
                    self._usr1 = (thread, r, w, prev_handler, prev_fd)
                    return
        faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        self._usr1 = "faulthandler"

    def on_signals(self, fn) -> bool:
        """Call ``fn(signum)`` from the ``nsa-stacks`` thread for every signal whose Python
        handler is installed, as it arrives, even while the main thread is blocked in C code
        (:meth:`GracefulStop.woken <nsa_jax.train.signals.GracefulStop.woken>`). False where this
        Watchdog has no such thread (no run directory, or made outside the main thread)."""
        if not isinstance(self._usr1, tuple):
            return False
        self._signal_hooks.append(fn)
        return True

    def _on_usr1(self, signum, frame) -> None:
        """The Python-level SIGUSR1 handler: the dump is the ``nsa-stacks`` thread's (module
        docstring); installing a handler makes Python's C-level one write to the pipe. A Python
        handler installed before ours (a job scheduler's preemption notice, say) still runs."""
        prev = self._usr1[3] if isinstance(self._usr1, tuple) else None
        if callable(prev):
            prev(signum, frame)

    def _usr1_loop(self, r: int, forward: int) -> None:
        """The ``nsa-stacks`` thread: one dump per read that holds a SIGUSR1 byte (a burst of
        signals may give one dump); the other signals' bytes go on to the wakeup fd set before
        ours, if any; a 0 byte (from :meth:`close`) ends it."""
        while True:
            try:
                data = os.read(r, 512)
            except OSError:
                return
            stop = not data or 0 in data
            data = data.replace(b"\0", b"")
            if forward >= 0 and data:
                with contextlib.suppress(OSError):
                    os.write(forward, data)
            for signum in data:
                for fn in list(self._signal_hooks):
                    with contextlib.suppress(Exception):   # a hook's bug must not end the dumps
                        fn(signum)
            if signal.SIGUSR1 in data:
                self.dump_stacks(f"stacks on SIGUSR1 (pid {os.getpid()}, last: {self.where}, "
                                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}):", stderr=False)
            if stop:
                return

    def _unlisten_usr1(self) -> None:
        """Undo :meth:`_listen_usr1` (from the thread that made the Watchdog). Two Watchdogs
        at once in one process must be closed in the reverse order."""
        if self._usr1 == "faulthandler":
            faulthandler.unregister(signal.SIGUSR1)
        elif self._usr1 is not None:
            thread, r, w, prev_handler, prev_fd = self._usr1
            try:
                if signal.getsignal(signal.SIGUSR1) == self._on_usr1:   # else someone else's
                    signal.signal(signal.SIGUSR1,
                                  prev_handler if prev_handler is not None else signal.SIG_DFL)
                current = signal.set_wakeup_fd(prev_fd)
                if current != w:                 # someone else's since: leave theirs
                    signal.set_wakeup_fd(current)
            except ValueError:                   # not the main thread: leave it all in place
                return
            with contextlib.suppress(OSError):
                os.write(w, b"\0")
            thread.join(timeout=5)
            if not thread.is_alive():            # else it may still read r: keep both open
                os.close(r)
                os.close(w)
        self._usr1 = None

    def _run(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                where = f" (also in {self.stacks_path})" if self.stacks_path else ""
                try:
                    self._abort_dump(f"error: run.watchdog_s: no progress for {idle:.0f}s (last: "
                                     f"{self.where}); aborting; the stacks of all threads "
                                     f"follow{where}")
                finally:
                    os._exit(EXIT_HUNG)

    def _abort_dump(self, header: str) -> None:
        """The abort's dump: the stacks file first, then stderr from a helper thread given
        ``ABORT_STDERR_S`` seconds. A run can hang *on* stderr (a pipe whose reader stopped
        reading, or a main thread stuck inside a write to it, holding the stream's lock); the
        abort must not wait on it."""
        self.dump_stacks(header, stderr=False)
        t = threading.Thread(target=_dump, args=(sys.stderr, header), name="nsa-watchdog-stderr",
                             daemon=True)
        t.start()
        t.join(ABORT_STDERR_S)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._unlisten_usr1()
        if self._stacks is not None:
            with self._stacks_lock:
                self._stacks.close()
                self._stacks = None
            with contextlib.suppress(OSError):   # kept only when stacks were dumped into it
                if self.stacks_path.stat().st_size == 0:
                    self.stacks_path.unlink()
        if self._hb_fd is not None:
            os.close(self._hb_fd)
            self._hb_fd = None
