"""A training run whose output reader goes away (``nsa_jax.streams``): ``train 2>&1 | tee``
preempted as one process group loses ``tee`` to the same SIGTERM, and the run must still finish
its step, write its checkpoint and exit 0. Before the streams were wrapped, the signal's notice
(or the next progress line) raised ``BrokenPipeError`` inside the checkpoint write: exit 1 and no
checkpoint of the step."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

from nsa_testutil import cli_env
from test_faults import DELAY, DRIVER, ROOT, SUB, cache_dir, complete_steps, logged_step  # noqa: F401


def test_sigterm_after_the_output_pipe_broke_still_checkpoints(tmp_path, cache_dir):  # noqa: F811
    """Block-buffered output (no PYTHONUNBUFFERED), as under a scheduler; the read for step 8
    never returns, so the signal always comes before the run could end."""
    run = tmp_path / "run"
    env = cli_env(cache_dir)
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER,
                             json.dumps({"stall_train_batch": 8, **DELAY}), *SUB,
                             f"run.dir={run}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    at_step_5 = threading.Event()

    def read():                     # the pipe's reader, like tee, until step 5 is logged
        for line in proc.stdout:
            seen.append(line)
            if re.match(r"step 5/", line):
                at_step_5.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert at_step_5.wait(120), "".join(seen)[-3000:]
        proc.stdout.close()         # the reader is gone: every later write hits a broken pipe
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
    finally:
        proc.kill()
        proc.wait()
    step = logged_step(run)
    assert rc == 0, (rc, "".join(seen)[-3000:])
    assert 5 <= step <= 7, step                         # stopped early, at a finished step
    assert complete_steps(run)[-1] == step              # and that step's checkpoint is complete


def test_buffered_output_to_a_closed_pipe_is_not_an_exit_120(tmp_path):
    """``--help`` (long, block-buffered, never flushed by the CLI) into a pipe whose reader is
    gone: the streams are flushed inside the wrapper, so Python's last flush at exit has nothing
    left to fail on (before: "Exception ignored ... BrokenPipeError" and status 120)."""
    import os

    env = cli_env(tmp_path / "cache")
    env.pop("PYTHONUNBUFFERED", None)
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "nsa_jax.train", "--help"], cwd=ROOT,
                              env=env, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (0, "")
