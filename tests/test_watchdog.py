"""The training watchdog's SIGUSR1 stack dumps and their set-up and tear-down
(``nsa_jax.train.watchdog``): a dump for every signal while threads come and go and the main
thread is stuck in C code, the previous handler and wakeup fd put back by ``close`` and by a
constructor that fails. The watchdog inside a training run (heartbeat, dump, abort) is
``tests/test_faults.py::test_watchdog_heartbeat_usr1_and_abort``."""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nsa_jax.train.signals import REPEAT_S
from nsa_testutil import cli_env

ROOT = Path(__file__).resolve().parents[1]


# The main thread blocked inside C code, where it never runs a Python-level signal handler.
STUCK_IN_C = r'''
import ctypes
mutex = ctypes.create_string_buffer(64)              # glibc: all zeros is an unlocked mutex
lock = ctypes.CDLL(None).pthread_mutex_lock
lock(mutex)
print("stuck", flush=True)
lock(mutex)                                          # never returns
'''

# A process like a stuck run: jax's threads started before the Watchdog (SIGUSR1 unblocked in
# them), a thread stuck in a read, short-lived threads starting and exiting while running Python
# code (orbax's checkpoint threads do this), and the main thread blocked inside C code, where it
# never runs a Python-level signal handler (a relocked mutex, like a wait in a device call).
USR1_CHILD = r'''
import sys, threading
import jax
jax.devices()
from nsa_jax.train.watchdog import Watchdog
w = Watchdog(0, sys.argv[1])

def stuck_reader():
    threading.Event().wait()

def recurse(n):
    return sum(range(20)) if n == 0 else recurse(n - 1) + 1

def churn():
    while True:
        ts = [threading.Thread(target=recurse, args=(20,)) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

threading.Thread(target=stuck_reader, daemon=True).start()
for _ in range(2):
    threading.Thread(target=churn, daemon=True).start()
''' + STUCK_IN_C


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mutex, Linux signals")
def test_usr1_dump_never_kills_and_works_while_main_is_in_c_code(tmp_path):
    """SIGUSR1 100 times: every one gives a whole dump (the stuck reader and the main thread in
    it) while threads come and go. faulthandler.register's dump from the signal handler crashed
    such a process with SIGSEGV within ~50 signals; a Python-level handler alone never runs."""
    stacks = tmp_path / "stacks.txt"
    proc = subprocess.Popen([sys.executable, "-c", USR1_CHILD, str(tmp_path)], cwd=ROOT,
                            env=cli_env(tmp_path / "jax_cache"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "stuck\n", proc.communicate(timeout=30)
        for i in range(1, 101):
            proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while True:     # the i-th dump written whole (its header comes first)
                text = stacks.read_text()
                last = text.split("stacks on SIGUSR1 (pid ")[-1]
                if text.count("stacks on SIGUSR1 (pid ") >= i and "in stuck_reader" in last \
                        and "in <module>" in last:
                    break
                assert proc.poll() is None, (f"SIGUSR1 {i} ended the process "
                                             f"({proc.returncode}): {proc.stderr.read()}")
                assert time.monotonic() < deadline, f"no whole dump for SIGUSR1 {i}"
                time.sleep(0.002)
        dumps = stacks.read_text().split("stacks on SIGUSR1 (pid ")[1:]
        assert len(dumps) == 100
        for d in dumps:
            assert "in stuck_reader" in d and "in <module>" in d, d
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()


# Threads outside Python get a thread state each time they call into it (PyGILState_Ensure, as
# jax's C++ threads do); ctypes does the same for a callback run by a pthread it did not start.
# A new state is listed before it is filled in, so a dump that walks the thread list without its
# lock (faulthandler.dump_traceback) read a NULL frame pointer: CI's SIGSEGV in
# test_faults.py::test_watchdog_heartbeat_usr1_and_abort. Here that crashed in 0.2-10 s.
FOREIGN_CHILD = r'''
import ctypes, os, sys, threading, time
from nsa_jax.train.watchdog import _dump
libc = ctypes.CDLL(None)
callback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _arg: None)

def foreign_threads():
    tid = ctypes.c_ulong()
    while True:
        assert libc.pthread_create(ctypes.byref(tid), None, callback, None) == 0
        libc.pthread_join(tid, None)

for _ in range(2):
    threading.Thread(target=foreign_threads, daemon=True).start()
n, t0 = 0, time.monotonic()
with open(os.devnull, "w") as sink:
    while time.monotonic() - t0 < float(sys.argv[1]):
        _dump(sink, "stacks")
        n += 1
with open(sys.argv[2], "w") as f:
    _dump(f, "last")
print(n, flush=True)
os._exit(0)          # no interpreter shutdown while the pthreads may be entering Python
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pthreads through ctypes")
def test_dump_survives_threads_entering_python_from_outside(tmp_path):
    """Stack dumps back to back for 8 s while two threads keep starting pthreads that call into
    Python and end: the process lives, and a last dump holds the threads' frames."""
    out = tmp_path / "last.txt"
    proc = subprocess.run([sys.executable, "-c", FOREIGN_CHILD, "8", str(out)], cwd=ROOT,
                          env=cli_env(tmp_path / "jax_cache"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert int(proc.stdout) > 100
    text = out.read_text()
    assert text.startswith("last\n") and "in foreign_threads" in text and "in <module>" in text


def test_watchdog_close_puts_usr1_back(tmp_path):
    """The nsa-stacks thread ends and the previous handler and wakeup fd are back; a handler
    and a wakeup fd set before get the signal (and its bytes) meanwhile. (A Watchdog made
    outside the main thread: ``test_watchdog_made_off_the_main_thread_puts_usr1_back``.)"""
    from nsa_jax.train.watchdog import Watchdog

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")

    def threads():
        return [t for t in threading.enumerate() if t.name == "nsa-stacks"]

    called = []

    def previous(signum, _frame):
        called.append(signum)

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old_handler = signal.signal(signal.SIGUSR1, previous)
    old_fd = signal.set_wakeup_fd(w)
    try:
        wd = Watchdog(0, tmp_path)
        assert len(threads()) == 1 and signal.getsignal(signal.SIGUSR1) not in (
            previous, signal.SIG_DFL, None)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert called == [signal.SIGUSR1]             # the handler set before still runs
        deadline = time.monotonic() + 10
        while "in test_watchdog_close_puts_usr1_back" not in (tmp_path / "stacks.txt").read_text():
            assert time.monotonic() < deadline, "no dump"
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while True:                                   # forwarded to the wakeup fd set before
            with contextlib.suppress(BlockingIOError):
                assert os.read(r, 16) == bytes([signal.SIGUSR1])
                break
            assert time.monotonic() < deadline, "no byte forwarded"
            time.sleep(0.005)
        wd.close()
        assert threads() == [] and signal.getsignal(signal.SIGUSR1) is previous
        assert signal.set_wakeup_fd(w) == w
        assert (tmp_path / "stacks.txt").exists()    # kept: a dump was written
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGUSR1, old_handler if old_handler is not None else signal.SIG_DFL)
        os.close(r)
        os.close(w)


# A Watchdog made outside the main thread, where no Python handler can be set: it falls back to
# ``faulthandler.register``, whose dump walks the thread list without its lock (the SIGSEGV of the
# forty-fifth session's CI run). In a child without jax (no XLA threads entering Python), so the
# test's own process never takes that dump.
OFF_MAIN_CHILD = r'''
import os, signal, sys, threading
from pathlib import Path
from nsa_jax.train.watchdog import Watchdog

called = []
previous = lambda signum, frame: called.append(signum)
signal.signal(signal.SIGUSR1, previous)
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
box = []
t = threading.Thread(target=lambda: box.append(Watchdog(0, Path(sys.argv[1]))))
t.start()
t.join()
assert not [t for t in threading.enumerate() if t.name == "nsa-stacks"]
assert signal.set_wakeup_fd(w) == w


def dumped_here():
    os.kill(os.getpid(), signal.SIGUSR1)          # the main thread takes it: holds the GIL


dumped_here()
assert "in dumped_here" in (Path(sys.argv[1]) / "stacks.txt").read_text()
assert called == []                               # faulthandler does not chain
box[0].close()
assert signal.getsignal(signal.SIGUSR1) is previous and signal.set_wakeup_fd(w) == w
os.kill(os.getpid(), signal.SIGUSR1)              # faulthandler's dump is gone: the handler runs
for _ in range(1000):
    if called:
        break
assert called == [signal.SIGUSR1], called
print("ok", flush=True)
'''


def test_watchdog_made_off_the_main_thread_puts_usr1_back(tmp_path):
    """Made outside the main thread: faulthandler dumps on SIGUSR1 (no nsa-stacks thread, the
    wakeup fd untouched), and ``close`` unregisters it: the previous handler gets the next one."""
    proc = subprocess.run([sys.executable, "-c", OFF_MAIN_CHILD, str(tmp_path)], cwd=ROOT,
                          env=cli_env(tmp_path / "jax_cache"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-2000:]


def test_watchdog_that_fails_to_start_puts_usr1_back(tmp_path, monkeypatch):
    """A first heartbeat that cannot be written (a full disk) is one WriteFailed naming the file,
    and the SIGUSR1 handler, wakeup fd and nsa-stacks thread it had set up are gone with it."""
    from nsa_jax.train import watchdog as wdm

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")
    before = signal.getsignal(signal.SIGUSR1)

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wdm.os, "pwrite", full)
    with pytest.raises(wdm.WriteFailed, match="run.dir: cannot write .*heartbeat.json"):
        wdm.Watchdog(0, tmp_path)
    assert signal.getsignal(signal.SIGUSR1) == before
    assert not [t for t in threading.enumerate() if t.name == "nsa-stacks"]
    assert signal.set_wakeup_fd(-1) == -1


# A run that hangs on its stderr: a pipe whose reader stopped reading fills, and the next write
# blocks for good (here the main thread's; a warning or log line in a real run).
STDERR_CHILD = r'''
import sys
from nsa_jax.train.watchdog import Watchdog
w = Watchdog(1.0, sys.argv[1])
w.beat("step 7")
while True:
    sys.stderr.write("x" * 1000 + "\n")
'''


def test_watchdog_aborts_a_run_hung_on_its_stderr(tmp_path):
    """The abort writes the stacks file first and gives stderr a bounded wait: exit 3 within
    seconds (before, the watchdog thread blocked on the full pipe with the main thread and the
    process lived on)."""
    proc = subprocess.Popen([sys.executable, "-c", STDERR_CHILD, str(tmp_path)], cwd=ROOT,
                            env=cli_env(tmp_path / "jax_cache"), stderr=subprocess.PIPE)
    try:                              # stderr is never read
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert rc == 3
    text = (tmp_path / "stacks.txt").read_text()
    assert "error: run.watchdog_s: no progress" in text and "in <module>" in text


# The training loop's pair: a GracefulStop whose signals the Watchdog's thread also sees, and a
# main thread blocked in C code (a long compile, a hung collective) when both signals come. The
# shell that system() starts prints "stuck", so the main thread is inside the C call by then (a
# "stuck" printed from Python before the call let the first signal be handled in between).
TWICE_CHILD = r'''
import ctypes, sys
from nsa_jax.train.signals import GracefulStop
from nsa_jax.train.watchdog import Watchdog
w = Watchdog(0, sys.argv[1])
stop = GracefulStop()
assert w.on_signals(stop.woken)
ctypes.CDLL(None).system(b"echo stuck; exec sleep 60 > /dev/null 2>&1")
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mutex, Linux signals")
def test_second_sigterm_while_main_is_blocked_exits_at_once(tmp_path):
    """One SIGTERM to a main thread stuck in C code waits (the graceful stop runs when it is
    back), also when it comes twice back to back (GNU ``timeout`` signals the child and then its
    group: one request); a second one later ends the process at once with status 143 (before:
    it waited too)."""
    proc = subprocess.Popen([sys.executable, "-c", TWICE_CHILD, str(tmp_path)], cwd=ROOT,
                            env=cli_env(tmp_path / "jax_cache"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "stuck\n", proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)              # the same request, delivered twice
        time.sleep(REPEAT_S + 0.5)
        assert proc.poll() is None                    # it only asks
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        assert rc == 128 + signal.SIGTERM
        assert "received SIGTERM again: exiting at once" in proc.stderr.read()
    finally:
        proc.kill()
        proc.communicate()


def test_woken_takes_a_repeat_within_repeat_s_as_one_request():
    """``GracefulStop.woken`` exits on a second signal, not on the same one delivered twice."""
    from nsa_jax.train import signals

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")
    exits, clock = [], [100.0]
    stop = signals.GracefulStop(clock=lambda: clock[0], exit_now=exits.append)
    try:
        stop.woken(signal.SIGUSR1)                    # not one of its signals
        stop.woken(signal.SIGTERM)
        clock[0] += signals.REPEAT_S / 2
        stop.woken(signal.SIGTERM)                    # the same request, delivered twice
        assert exits == []
        clock[0] += signals.REPEAT_S
        stop.woken(signal.SIGINT)
        assert exits == [128 + signal.SIGINT]
    finally:
        stop.close()
