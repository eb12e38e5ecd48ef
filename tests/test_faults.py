"""Fault injection for the training system (issue 7): signals, kill -9 (also mid-checkpoint),
corrupt checkpoints, non-finite steps, failing and stalling data, hangs, a full disk.

Tiny dense models on synthetic data (the faults do not depend on the attention). Signals and
kill -9 need a child process: it runs ``DRIVER``, which applies an injection named in a JSON spec
(slower batches, a read that never returns, checkpoint writes that never finish) and then calls
the CLI's ``main``. Everything else calls ``main`` in-process with ``monkeypatch`` injections.
Loss sequences are compared for exact equality with an uninterrupted run of the same kind
(subprocess with subprocess, in-process with in-process).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nsa_jax.config import load_config
from nsa_jax.train.cli import main
from nsa_jax.train.metrics import read_metrics
from nsa_testutil import cli_env, shared

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
SMALL = ["data.source=synthetic", "data.path=null", "data.seq_len=64", "data.prefetch=1",
         "model.vocab_size=256", "model.dim=64", "model.n_layers=1", "model.n_heads=2",
         "model.n_kv_groups=1", "model.head_dim=32", "model.mlp_hidden=128",
         "model.attention=dense", "train.batch_size=4", "train.warmup_steps=4", "train.lr=3e-3",
         "train.eval_every=0"]
# subprocess runs: 30 steps, every one logged, a checkpoint every 5, eval every 10
SUB = ["--config", TINY, *SMALL, "train.steps=30", "train.log_every=1", "train.ckpt_every=5",
       "train.ckpt_keep=3", "train.eval_every=10", "train.eval_batches=1"]
# in-process runs: 12 steps, checkpoints 4, 8, 12
INPROC = ["--config", TINY, *SMALL, "train.steps=12", "train.log_every=1", "train.ckpt_every=4",
          "train.ckpt_keep=3"]
DELAY = {"batch_delay_s": 0.03}     # ~1 s per 30 steps: time to aim a signal at a step
SEED = int(time.time())             # kill points are random; the seed is in failure messages

# ---- the child process ---------------------------------------------------------------------
DRIVER = r'''
import json, sys, threading, time
from pathlib import Path

spec = json.loads(sys.argv[1])
from nsa_jax.data import synthetic

real_next_rows = synthetic.SyntheticSource.next_rows
train_calls = [0]

def next_rows(self, count):
    if self.split_id == 1:                       # the train split
        train_calls[0] += 1
        if train_calls[0] == spec.get("stall_train_batch"):
            threading.Event().wait()             # a read that never returns
        time.sleep(spec.get("batch_delay_s", 0))
    return real_next_rows(self, count)

synthetic.SyntheticSource.next_rows = next_rows

if spec.get("slow_save_after") is not None:      # writes of later steps never finish
    from nsa_jax.train import checkpoint as ck
    after, marks = spec["slow_save_after"], Path(spec["marks"])

    class Hang:
        def __init__(self, step):
            self.step = step
        def result(self, timeout=None):
            (marks / f"saving-{self.step}").write_text("")
            time.sleep(600)
        def cancel(self):
            return False

    real_handlers = ck._handlers

    def handlers():
        h = real_handlers()
        real = h["meta"].async_save
        async def async_save(directory, item=None, args=None):
            futures = list(await real(directory, item, args) or [])
            step = int(Path(directory).parent.name.split(".")[0])
            return futures + ([Hang(step)] if step > after else [])
        h["meta"].async_save = async_save
        return h

    ck._handlers = handlers

from nsa_jax.train.cli import main
raise SystemExit(main(sys.argv[2:]))
'''


class Child:
    """One training process running DRIVER; stdout/stderr go to files."""

    def __init__(self, tmp: Path, name: str, spec: dict, args: list[str], cache_dir):
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(spec), *args],
                                         cwd=ROOT, env=cli_env(cache_dir), stdout=o, stderr=e)

    def logs(self) -> str:
        return f"stdout:\n{self.out.read_text()[-3000:]}\nstderr:\n{self.err.read_text()[-3000:]}"

    def wait_for(self, cond, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"[seed {SEED}] process ended ({self.proc.returncode}) before "
                            f"{what}\n{self.logs()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"[seed {SEED}] no {what} in {timeout}s\n{self.logs()}")
            time.sleep(0.005)

    def step(self) -> int:
        """The newest step this process has logged (its own stdout, not the run's metrics)."""
        steps = re.findall(r"^step (\d+)/", self.out.read_text(), re.M)
        return int(steps[-1]) if steps else 0

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def logged_step(run: Path) -> int:
    """The newest train step in metrics.jsonl (0 if none)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    best = 0
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in e:
            best = max(best, e["step"])
    return best


def complete_steps(run: Path) -> list[int]:
    d = run / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def curves(run: Path):
    """(step, loss, grad_norm), (step, eval_loss) and (step, tokens_seen) of a run."""
    e = read_metrics(run / "metrics.jsonl")
    return ([(x["step"], x["loss"], x["grad_norm"]) for x in e if "loss" in x],
            [(x["step"], x["eval_loss"]) for x in e if "eval_loss" in x],
            [(x["step"], x["tokens_seen"]) for x in e if "loss" in x])


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory, worker_id):
    return shared(tmp_path_factory, worker_id, "fault_jax_cache", lambda d: d.mkdir())


@contextlib.contextmanager
def persistent_cache(path: Path):
    """In-process runs of one config compile once (test speed only; restored afterwards)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    old = [getattr(jax.config, k) for k in keys]
    jax.config.update(keys[0], str(path))
    jax.config.update(keys[1], 0)
    cc.reset_cache()
    try:
        yield
    finally:
        for k, v in zip(keys, old):
            jax.config.update(k, v)
        cc.reset_cache()


@pytest.fixture(autouse=True)
def _inproc_cache(cache_dir):
    with persistent_cache(cache_dir / "inproc"):
        yield


@pytest.fixture(scope="session")
def sub_reference(tmp_path_factory, worker_id, cache_dir):
    """The uninterrupted 30-step subprocess run."""
    def make(run):
        run.parent.mkdir(parents=True, exist_ok=True)
        c = Child(run.parent, run.name, {}, SUB + [f"run.dir={run}"], cache_dir)
        assert c.finish() == 0, c.logs()
    run = shared(tmp_path_factory, worker_id, "fault_sub_reference", make)
    a = curves(run)
    assert [s for s, _, _ in a[0]] == list(range(1, 31)) and len(a[1]) == 3
    return a


@pytest.fixture(scope="session")
def inproc_reference(tmp_path_factory, worker_id, cache_dir):
    """The uninterrupted 12-step in-process run (checkpoints 4, 8, 12)."""
    def make(run):
        with persistent_cache(cache_dir / "inproc"):
            assert main(INPROC + [f"run.dir={run}"]) == 0
    return shared(tmp_path_factory, worker_id, "fault_inproc_reference", make)


def one_error_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- SIGINT / SIGTERM: finish the step, checkpoint, exit 0 ----------------------------------
def test_sigint_and_sigterm_stop_cleanly_and_resume_bit_identical(tmp_path, cache_dir,
                                                                  sub_reference):
    rnd = random.Random(SEED)
    run = tmp_path / "run"
    args = SUB + [f"run.dir={run}"]
    stops = []
    for i, sig in enumerate((signal.SIGINT, signal.SIGTERM)):
        c = Child(tmp_path, f"part{i}", DELAY, args + (["run.resume=true"] if i else []),
                  cache_dir)
        target = (stops[-1] if stops else 0) + rnd.randint(2, 9)
        c.wait_for(lambda: c.step() >= target, f"step {target}")
        c.proc.send_signal(sig)
        t0 = time.monotonic()
        assert c.finish(timeout=60) == 0, c.logs()
        assert time.monotonic() - t0 < 20, "the clean stop took too long"
        name = signal.Signals(sig).name
        out, err = c.out.read_text(), c.err.read_text()
        assert f"received {name}: finishing the current step" in err
        m = re.search(rf"stopped by {name} after step (\d+): checkpoint (\S+) (written|is the "
                      rf"newest); resume with run.resume=true", out)
        assert m, c.logs()
        step = int(m.group(1))
        assert target <= step < 30 and m.group(2) == str(run / "checkpoints" / str(step))
        assert complete_steps(run)[-1] == step            # complete and the newest
        assert logged_step(run) == step                   # that step finished, no later one
        if i:
            assert f"resumed at step {stops[-1]}" in out
        stops.append(step)
    c = Child(tmp_path, "last", {}, args + ["run.resume=true"], cache_dir)
    assert c.finish() == 0, c.logs()
    assert f"resumed at step {stops[-1]}" in c.out.read_text()
    assert curves(run) == sub_reference, f"[seed {SEED}] stops at {stops}"


# ---- kill -9 at random points, mid-checkpoint, and a second signal ---------------------------
def test_kill9_mid_checkpoint_random_kill_and_second_signal(tmp_path, cache_dir, sub_reference):
    rnd = random.Random(SEED + 1)
    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    args = SUB + [f"run.dir={run}"]

    def saving():
        return sorted(int(p.name.split("-")[1]) for p in marks.iterdir())

    # 1. kill -9 while the write of a checkpoint is in flight (it never finishes)
    hang = rnd.choice([5, 10, 15])
    c = Child(tmp_path, "a", {"slow_save_after": hang, "marks": str(marks), **DELAY}, args,
              cache_dir)
    c.wait_for(lambda: saving(), f"the write of checkpoint {hang + 5}")
    os.kill(c.proc.pid, signal.SIGKILL)
    assert c.finish() == -signal.SIGKILL
    partial = [p.name for p in (run / "checkpoints").iterdir() if not p.name.isdigit()]
    assert complete_steps(run) == [s for s in (5, 10, 15) if s <= hang]
    assert any(n.startswith(f"{hang + 5}.") for n in partial), partial  # left half-written

    # 2. resume (the partial one is never chosen), kill -9 at a random later step; the read for
    # step kill_at + 2 never returns, so the run cannot end (checkpoint 30) before the kill
    kill_at = rnd.randint(hang + 2, 27)
    c = Child(tmp_path, "b", {"stall_train_batch": kill_at + 2 - hang, **DELAY},
              args + ["run.resume=true"], cache_dir)
    c.wait_for(lambda: c.step() >= kill_at, f"step {kill_at}")
    os.kill(c.proc.pid, signal.SIGKILL)
    assert c.finish() == -signal.SIGKILL
    assert f"resumed at step {hang}" in c.out.read_text()
    newest = complete_steps(run)[-1]

    # 3. SIGTERM, then a second SIGTERM while the checkpoint write is in flight: exits at once
    for p in marks.iterdir():
        p.unlink()
    c = Child(tmp_path, "c", {"slow_save_after": newest, "marks": str(marks), **DELAY},
              args + ["run.resume=true"], cache_dir)
    c.wait_for(lambda: c.step() > newest, f"a step after {newest}")
    c.proc.send_signal(signal.SIGTERM)
    c.wait_for(lambda: "received SIGTERM" in c.err.read_text(), "the first signal's line")
    c.wait_for(lambda: saving(), "a checkpoint write in flight")
    c.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert c.finish(timeout=30) == -signal.SIGTERM, c.logs()
    assert time.monotonic() - t0 < 5
    assert complete_steps(run)[-1] == newest          # the interrupted write is not listed

    # 4. resume to the end: the same losses, bit for bit, as the uninterrupted run
    c = Child(tmp_path, "d", {}, args + ["run.resume=true"], cache_dir)
    assert c.finish() == 0, c.logs()
    assert f"resumed at step {newest}" in c.out.read_text()
    assert curves(run) == sub_reference, f"[seed {SEED}] hang {hang}, kill at {kill_at}"


# ---- watchdog: heartbeat, stacks on SIGUSR1, abort after run.watchdog_s ----------------------
def test_watchdog_heartbeat_usr1_and_abort(tmp_path, cache_dir):
    run = tmp_path / "run"
    c = Child(tmp_path, "w", {"stall_train_batch": 7},
              SUB + [f"run.dir={run}", "run.watchdog_s=3"], cache_dir)
    beat = run / "heartbeat.json"

    def at_step_6():
        try:
            return json.loads(beat.read_text())["step"] == 6
        except (OSError, ValueError):
            return False

    c.wait_for(at_step_6, "heartbeat at step 6")
    hb = json.loads(beat.read_text())
    assert hb["pid"] == c.proc.pid and hb["where"] == "step 6" and time.time() - hb["time"] < 60
    stacks = run / "stacks.txt"
    c.proc.send_signal(signal.SIGUSR1)
    c.wait_for(lambda: "next_rows" in stacks.read_text(), "a stack dump on SIGUSR1",
               timeout=10)
    assert c.proc.poll() is None                      # SIGUSR1 does not stop the run
    t0 = time.monotonic()
    assert c.finish(timeout=30) == 3, c.logs()
    assert time.monotonic() - t0 < 10
    err = c.err.read_text()
    assert re.match(r"error: run.watchdog_s: no progress for [34]s \(last: step 6\); aborting",
                    err), err
    text = stacks.read_text()
    assert text.count("error: run.watchdog_s: no progress") == 1
    # the stuck read (prefetch thread) and the waiting main thread are both in the dump
    assert "in next_rows" in text and "in next" in text
    assert complete_steps(run) == [5]


# ---- in-process: corrupt checkpoints -------------------------------------------------------
def _flip_byte(path: Path) -> None:
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0x10
    path.write_bytes(bytes(b))


def _biggest(d: Path) -> Path:
    return max((p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


CORRUPTIONS = {
    "meta truncated": lambda s: (s / "meta" / "metadata").write_text(
        (s / "meta" / "metadata").read_text()[:100]),
    "params bytes garbled": lambda s: _biggest(s / "params").write_bytes(b"\0garbage" * 100),
    "params bit flipped": lambda s: _flip_byte(_biggest(s / "params")),
    "train item deleted": lambda s: shutil.rmtree(s / "train"),
    "array metadata truncated": lambda s: (s / "train" / "_METADATA").write_text("{"),
}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_newest_checkpoint_falls_back(kind, tmp_path, capsys, inproc_reference):
    from nsa_jax.train.start import preflight

    run = tmp_path / "run"
    shutil.copytree(inproc_reference, run)
    CORRUPTIONS[kind](run / "checkpoints" / "12")
    if kind == "params bit flipped":                  # and an older one too: two fall-backs
        CORRUPTIONS[kind](run / "checkpoints" / "8")
    capsys.readouterr()
    cfg = load_config(TINY, INPROC[2:] + ["train.steps=16", f"run.dir={run}",
                                          "run.resume=true"])
    pre = preflight(cfg, False)
    pre.loader.close()
    want = 4 if kind == "params bit flipped" else 8
    assert pre.step == want and int(pre.state.step) == want
    assert list(pre.bad_steps) == ([12, 8] if want == 4 else [12])
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == len(pre.bad_steps), warnings
    assert warnings[0].startswith(f"warning: {run / 'checkpoints' / '12'}")
    assert warnings[-1].endswith(f"falling back to step {want}")
    if kind == "params bit flipped":
        assert "does not match its checksum" in warnings[0]
    assert complete_steps(run) == [4, 8, 12]          # checking moved nothing


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_checkpoint_resume_and_inference(tmp_path, capsys, inproc_reference):
    """A full resume past a corrupt newest checkpoint: the bad one is moved aside, training
    continues from the previous one and recomputes the same losses; generation falls back too."""
    from nsa_jax.train import load_for_inference

    run = tmp_path / "run"
    shutil.copytree(inproc_reference, run)
    _flip_byte(_biggest(run / "checkpoints" / "12" / "params"))
    capsys.readouterr()
    _, model = load_for_inference(run)                # newest usable: step 8
    _, model4 = load_for_inference(run, step=4)
    err = capsys.readouterr().err
    assert f"warning: {run / 'checkpoints' / '12'}/params:" in err
    assert "falling back to step 8" in err
    assert not np.array_equal(np.asarray(model.embed.embedding[...]),
                              np.asarray(model4.embed.embedding[...]))

    code = main(INPROC + [f"run.dir={run}", "run.resume=true"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "resumed at step 8" in out
    assert f"moved the unusable checkpoint {run / 'checkpoints' / '12'} to " \
           f"{run / 'corrupt_checkpoints' / '12'}" in err
    assert complete_steps(run) == [4, 8, 12]          # a new, good step 12
    assert (run / "corrupt_checkpoints" / "12" / "params").is_dir()
    assert curves(run) == curves(inproc_reference)


def _corrupt_arrays(step_dir: Path, how: str) -> None:
    """Truncate or bit-flip every array data file (not the metadata) of a checkpoint."""
    for f in sorted(step_dir.glob("*/ocdbt.process_0/d/*")):
        if how == "truncated":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            _flip_byte(f)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("how", ["truncated", "bit flipped"])
def test_corrupt_array_data_newest_then_all(how, tmp_path, capsys, inproc_reference):
    """Array data (not metadata) truncated or bit-flipped: the newest one -> one warning and the
    step it fell back to; all of them -> one error line naming every step (nothing moved)."""
    from nsa_jax.generate import main as generate_main
    from nsa_jax.train.inference import restore_for_inference

    run = tmp_path / "run"
    shutil.copytree(inproc_reference, run)
    _corrupt_arrays(run / "checkpoints" / "12", how)
    capsys.readouterr()
    assert restore_for_inference(run).step == 8
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {run / 'checkpoints' / '12'}"), err
    assert err[0].endswith("falling back to step 8") and len(err[0]) < 600, err
    for step in (4, 8):
        _corrupt_arrays(run / "checkpoints" / str(step), how)
    assert generate_main(["--checkpoint", str(run)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{run / 'checkpoints' / '12'}" in line and "step 8, 4, are unusable" in line
    assert main(INPROC + [f"run.dir={run}", "run.resume=true"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "no usable checkpoint" in line and "step 8, 4, are unusable" in line
    assert complete_steps(run) == [4, 8, 12] and not (run / "corrupt_checkpoints").exists()


def test_corrupt_array_data_cli_prints_one_line(tmp_path, cache_dir, inproc_reference):
    """In a process of its own (where orbax's leftover tasks would print their tracebacks at
    exit): every checkpoint truncated -> exactly one line on stderr."""
    run = tmp_path / "run"
    shutil.copytree(inproc_reference, run)
    for step in (4, 8, 12):
        _corrupt_arrays(run / "checkpoints" / str(step), "truncated")
    r = subprocess.run([sys.executable, "-m", "nsa_jax.generate", "--checkpoint", str(run)],
                       cwd=ROOT, env=cli_env(cache_dir), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert r.stderr.startswith("error: ") and "no usable checkpoint" in r.stderr


# ---- in-process: non-finite steps -----------------------------------------------------------
def test_non_finite_streak_stops_and_keeps_last_good_checkpoint(tmp_path, capsys):
    """lr=1e30: step 1 is finite, every later step is not. Checkpoints due inside the streak are
    deferred, so ckpt_keep=1 cannot rotate step 1's away; the streak is seen one step late when
    the step is not logged (log_every=3)."""
    from nsa_jax.train import load_for_inference

    run = tmp_path / "run"
    code = main(["--config", TINY, *SMALL, "train.lr=1e30", "train.warmup_steps=0",
                 "train.steps=10", "train.log_every=3", "train.ckpt_every=1",
                 "train.ckpt_keep=1", "train.max_bad_steps=3", f"run.dir={run}"])
    out, err = capsys.readouterr()
    assert code == 1
    line = one_error_line(err)
    assert line == (f"error: 3 consecutive steps up to step 4 had a non-finite loss or gradient "
                    f"(train.max_bad_steps=3); lower train.lr or check the data; the newest "
                    f"complete checkpoint is step 1 ({run / 'checkpoints' / '1'})")
    assert "checkpoint of step 2 deferred: the last 1 step(s) were skipped" in out
    assert complete_steps(run) == [1]
    entries = read_metrics(run / "metrics.jsonl")
    assert [(e["step"], e["skipped_steps"], e["bad_steps"]) for e in entries] == [(3, 2, 2)]
    _, model = load_for_inference(run)
    emb = np.asarray(model.embed.embedding[...])
    assert np.isfinite(emb).all()


# ---- in-process: data that fails or stalls ---------------------------------------------------
def test_stalled_read_signal_then_timeout_then_resume(tmp_path, capfd, monkeypatch,
                                                      inproc_reference):
    """A read that never returns: a SIGTERM arriving meanwhile still stops the run cleanly
    (status 0); with train.data_timeout_s the stall itself stops it after a checkpoint
    (status 1); the resumed run ends as an uninterrupted one."""
    from nsa_jax.data import synthetic
    from nsa_jax.train.watchdog import Watchdog

    release, step_6_done = threading.Event(), threading.Event()
    real = synthetic.SyntheticSource.next_rows
    plan = {"calls": 0, "stall_at": 7, "signal": True}

    def next_rows(self, count):
        if self.split_id == 1:
            plan["calls"] += 1
            if plan["calls"] == plan["stall_at"]:
                if plan["signal"]:          # from this (prefetch) thread, once step 6 is done
                    assert step_6_done.wait(60)     # (a fixed sleep lost to a slow step 5)
                    os.kill(os.getpid(), signal.SIGTERM)
                release.wait(60)
        return real(self, count)

    real_beat = Watchdog.beat

    def beat(self, where="", step=None):
        real_beat(self, where, step)
        if where == "step 6":
            step_6_done.set()

    monkeypatch.setattr(synthetic.SyntheticSource, "next_rows", next_rows)
    monkeypatch.setattr(Watchdog, "beat", beat)
    run = tmp_path / "run"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = main(INPROC + [f"run.dir={run}"])
        out, err = capfd.readouterr()
        assert code == 0, err
        assert signal.getsignal(signal.SIGTERM) == previous      # handlers put back
        assert "received SIGTERM: finishing the current step" in err
        assert (f"stopped by SIGTERM after step 6: checkpoint {run / 'checkpoints' / '6'} "
                f"written; resume with run.resume=true") in out
        assert complete_steps(run) == [4, 6]

        release.set()
        release.clear()
        plan.update(calls=0, stall_at=4, signal=False)    # steps 7-9, then no batch
        t0 = time.monotonic()
        code = main(INPROC + [f"run.dir={run}", "run.resume=true", "train.data_timeout_s=0.5"])
        took = time.monotonic() - t0
    finally:
        release.set()
    out, err = capfd.readouterr()
    assert code == 1 and took < 60 and "resumed at step 6" in out
    assert one_error_line(err) == (
        f"error: data: no batch of the train data (data.source=synthetic) within "
        f"train.data_timeout_s=0.5s (a stalled read); stopped after step 9; checkpoint "
        f"{run / 'checkpoints' / '9'} written; resume with run.resume=true")
    assert complete_steps(run) == [6, 8, 9]
    meta = json.loads((run / "checkpoints" / "9" / "meta" / "metadata").read_text())
    assert meta["data"][0]["seq"] == 9 * 4          # exactly the batches of steps 1-9
    assert json.loads((run / "heartbeat.json").read_text())["step"] == 9

    monkeypatch.setattr(synthetic.SyntheticSource, "next_rows", real)
    assert main(INPROC + [f"run.dir={run}", "run.resume=true"]) == 0
    assert "resumed at step 9" in capfd.readouterr().out
    assert curves(run) == curves(inproc_reference)


def test_multi_process_stop_agreement(monkeypatch):
    """Several processes stop together: flags are gathered only at sync points, and a signal
    on any process stops all of them."""
    import jax
    from jax.experimental import multihost_utils

    from nsa_jax.train.signals import GracefulStop

    remote = {"flag": 0}
    gathered = []

    def allgather(x):
        gathered.append(int(x[0]))
        return np.stack([x, np.array([remote["flag"]], np.int32)])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    stop = GracefulStop()
    try:
        assert not stop.agreed(sync_point=True) and gathered == [0]
        remote["flag"] = int(signal.SIGTERM)          # only the other process got it
        assert not stop.agreed(sync_point=False) and gathered == [0]
        assert stop.agreed(sync_point=True) and stop.name == "SIGTERM"
        assert not stop.requested() or stop.signum == signal.SIGTERM
    finally:
        stop.close()


def test_data_source_errors_retried_then_clean_stop(tmp_path, capsys, caplog, monkeypatch):
    """An hf stream (local jsonl through ``datasets``) whose reads fail: retried with backoff
    and logged; when the retries run out the run stops with a checkpoint (status 1); a resume
    whose reads fail twice recovers and gives the losses of a run without failures."""
    pytest.importorskip("datasets")
    from nsa_jax.data import hf
    from nsa_jax.train.watchdog import Watchdog

    sample = ROOT / "nsa_jax" / "assets" / "data" / "fineweb_edu_sample.jsonl"
    args = ["--config", TINY, *SMALL, "data.source=hf", "data.hf_name=json",
            "data.hf_config=null", f"data.path={sample}", "data.tokenizer=byte",
            "data.max_docs=1", "data.eval_fraction=0", "data.retry_backoff_s=0.1",
            "train.steps=48", "train.log_every=1", "train.ckpt_every=8"]
    state = {"armed_at": None, "fails": 0, "step": 0}
    real_load, real_beat = hf.HFDocs._load, Watchdog.beat

    def beat(self, where="", step=None):
        state["step"] = step if step is not None else state["step"]
        return real_beat(self, where, step)

    def load(self):
        if state["armed_at"] is not None and state["step"] >= state["armed_at"] \
                and state["fails"]:
            state["fails"] -= 1
            raise ConnectionError("injected: connection reset by peer")
        return real_load(self)

    monkeypatch.setattr(Watchdog, "beat", beat)
    monkeypatch.setattr(hf.HFDocs, "_load", load)
    caplog.set_level(logging.WARNING, logger="nsa_jax.data")

    # a stream that cannot be opened at all: one line, status 1, before any output
    state.update(armed_at=0, fails=10**6)
    assert main(args + [f"run.dir={tmp_path / 'never'}", "data.retries=1"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "error: data: opening the train data (data.source=hf) failed after data.retries=1 "
        "retries (ConnectionError: injected: connection reset by peer)")
    assert not (tmp_path / "never").exists()

    state.update(armed_at=None, fails=0, step=0)
    ref = tmp_path / "ref"
    assert main(args + [f"run.dir={ref}"]) == 0
    capsys.readouterr()

    # every read fails from step 12 on: 2 retries (0.1 s, 0.2 s), then a clean stop
    run = tmp_path / "run"
    state.update(armed_at=12, fails=10**6, step=0)
    caplog.clear()
    code = main(args + [f"run.dir={run}", "data.retries=2"])
    out, err = capsys.readouterr()
    assert code == 1
    line = one_error_line(err)
    m = re.fullmatch(r"error: data: reading the train data \(data.source=hf\) failed after "
                     r"data.retries=2 retries \(ConnectionError: injected: connection reset by "
                     r"peer\); stopped after step (\d+); checkpoint (\S+) written; resume with "
                     r"run.resume=true", line)
    assert m, line
    stop = int(m.group(1))
    assert 12 <= stop < 40 and m.group(2) == str(run / "checkpoints" / str(stop))
    assert complete_steps(run)[-1] == stop and logged_step(run) == stop
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2, retries
    assert "ConnectionError: injected" in retries[0]
    assert "retry 1/2 in 0.1s" in retries[0] and "retry 2/2 in 0.2s" in retries[1]

    # resume; two reads fail and are retried; the run ends as if nothing had happened
    state.update(armed_at=stop + 1, fails=2)
    caplog.clear()
    assert main(args + [f"run.dir={run}", "run.resume=true", "data.retries=3"]) == 0
    assert f"resumed at step {stop}" in capsys.readouterr().out
    assert state["fails"] == 0
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == 2
    assert curves(run) == curves(ref)


# ---- in-process: a full disk -----------------------------------------------------------------
class _Raise:
    """An orbax commit future whose write fails."""

    def __init__(self, exc):
        self.exc = exc

    def result(self, timeout=None):
        raise self.exc

    def cancel(self):
        return False


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_disk_full_checkpoint_and_metrics_then_resume(tmp_path, capsys, monkeypatch,
                                                      inproc_reference):
    from nsa_jax.train import checkpoint as ck
    from nsa_jax.train.metrics import MetricsLog

    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    run = tmp_path / "run"
    real_handlers = ck._handlers

    def handlers():                 # the meta write of step 8 fails with ENOSPC
        h = real_handlers()
        real = h["meta"].async_save

        async def async_save(directory, item=None, args=None):
            if Path(directory).parent.name.split(".")[0] == "8":
                return [_Raise(enospc)]
            return await real(directory, item, args)

        h["meta"].async_save = async_save
        return h

    monkeypatch.setattr(ck, "_handlers", handlers)
    logging.getLogger("absl").disabled = True        # orbax logs the failed write at length
    try:
        code = main(INPROC + [f"run.dir={run}"])
    finally:
        logging.getLogger("absl").disabled = False
    err = capsys.readouterr().err
    assert code == 1
    assert one_error_line(err) == (
        f"error: checkpoint step 8: cannot write {run / 'checkpoints' / '8'} (No space left on "
        f"device); the newest complete checkpoint is step 4 ({run / 'checkpoints' / '4'})")
    assert complete_steps(run) == [4]
    monkeypatch.setattr(ck, "_handlers", real_handlers)

    # resume; the metrics write of step 10 fails
    real_append = MetricsLog._append

    def append(self, line):
        if json.loads(line)["step"] == 10:
            self._f.write(line[:20])                  # a partial line, then the error
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_append(self, line)

    monkeypatch.setattr(MetricsLog, "_append", append)
    code = main(INPROC + [f"run.dir={run}", "run.resume=true"])
    out, err = capsys.readouterr()
    assert code == 1 and "resumed at step 4" in out
    assert one_error_line(err) == (
        f"error: run.dir: cannot write {run / 'metrics.jsonl'} (No space left on device); the "
        f"newest complete checkpoint is step 8 ({run / 'checkpoints' / '8'})")
    assert complete_steps(run) == [4, 8]
    monkeypatch.setattr(MetricsLog, "_append", real_append)

    # nothing on disk is corrupt: the next resume continues and ends as an uninterrupted run
    assert main(INPROC + [f"run.dir={run}", "run.resume=true"]) == 0
    assert "resumed at step 8" in capsys.readouterr().out
    assert curves(run) == curves(inproc_reference)
    assert load_config(run / "config.yaml").train.steps == 12
    assert not list(run.glob("*.tmp"))


def test_disk_full_at_start_is_bad_input(tmp_path, capsys, monkeypatch):
    """Writing config.yaml fails: status 2 before any compute, nothing half-written."""
    from nsa_jax.train import outputs

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) + ".tmp")

    monkeypatch.setattr(outputs, "atomic_write_text", full)
    run = tmp_path / "run"
    assert main(INPROC + [f"run.dir={run}"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: run.dir: cannot write {run / 'config.yaml'} (No space left on device)")
    assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()


def test_failed_read_collects_orbax_leftovers_without_a_warning():
    """A failed orbax read leaves coroutines it never awaited; ``checkpoint._reason`` collects
    them, and Python's "coroutine ... was never awaited" RuntimeWarning, issued while that
    collection finalises them, is not passed on to the user (seen once in a full test run)."""
    import gc
    import warnings

    from nsa_jax.train.checkpoint import _reason

    async def _read_array_index_and_device_put():   # stands for orbax's leftover read
        return None

    class Cycle:   # only a collection frees it, as with orbax's leftover tasks
        pass

    gc.collect()
    c = Cycle()
    c.me, c.coro = c, _read_array_index_and_device_put()
    del c
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert "boom" in _reason(ValueError("boom"))
    assert not [w for w in seen if "never awaited" in str(w.message)], [str(w.message) for w in seen]
