"""The periodic pieces of the training loop, one small unit each (the loop in
:mod:`nsa_jax.train.loop` calls them in order after every step):

* :class:`Profiler` -- a jax.profiler trace of ``train.profile_steps``;
* :class:`Reporter` -- loss/tokens bookkeeping, metrics.jsonl, TensorBoard and the progress
  line at log steps; tokens/s counts training time only (evaluation, checkpoint writes and
  trace writing are paused out, after the device has finished the steps before them);
* :class:`Evaluator` -- the held-out loss every ``train.eval_every`` steps;
* :class:`BadStepGuard` -- checks every step's non-finite streak, in order, as soon as it is
  known (without blocking the host); ``train.max_bad_steps`` in a row raise TrainingFailed;
* :class:`CheckpointPolicy` -- saves every ``train.ckpt_every`` steps and at the end, defers a
  save due inside a non-finite streak to its end, and saves the last step before a stop.
"""
from __future__ import annotations

import collections
import time

import jax
import numpy as np

from nsa_jax.errors import os_reason
from nsa_jax.train import mesh as meshlib
from nsa_jax.train.errors import DataFailed, TrainingFailed, WriteFailed
from nsa_jax.train.feed import BatchFeed, open_loader
from nsa_jax.train.metrics import show_log


class Profiler:
    def __init__(self, window, out_dir, say):
        self.window, self.dir, self.say, self.active = window, out_dir, say, False

    def before(self, step: int) -> None:
        if self.window and step == self.window[0]:
            jax.profiler.start_trace(str(self.dir), create_perfetto_trace=True)
            self.active = True

    def after(self, step: int, stats) -> float:
        """Seconds spent writing the trace (0 unless the window ends at ``step``)."""
        if not (self.active and step == self.window[1]):
            return 0.0
        jax.block_until_ready(stats)      # the traced steps' compute is training time
        p0 = time.perf_counter()
        self.finish()
        self.say(f"profile of steps {self.window[0]}-{step} written to {self.dir}")
        return time.perf_counter() - p0

    def finish(self) -> None:
        if self.active:
            self.active = False
            jax.profiler.stop_trace()


class Reporter:
    """Training-time clock, window averages, and the outputs of log steps."""

    def __init__(self, start, metrics, tb, progress):
        self.start, self.metrics, self.tb, self.progress = start, metrics, tb, progress
        self.tokens_per_step = start.cfg.train.batch_size * start.cfg.data.seq_len
        self.tokens_seen, self.last = start.tokens_seen, {}
        self.begin()

    def begin(self) -> None:
        self.t_start = self.win_t = time.perf_counter()
        self.win_step, self.paused = self.start.step, 0.0
        self.loss_sum = jax.numpy.zeros((), np.float32)   # on device: no sync per step

    def elapsed(self) -> float:
        return self.start.elapsed_s + time.perf_counter() - self.t_start

    def pause(self, seconds: float) -> None:
        self.paused += seconds

    def timed(self, fn, sync=None):
        """``fn()`` with its time paused out (after waiting for ``sync`` to be computed)."""
        if sync is not None:
            jax.block_until_ready(sync)
        p0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.pause(time.perf_counter() - p0)

    def step(self, stats) -> None:
        self.tokens_seen += self.tokens_per_step
        self.loss_sum = self.loss_sum + stats["loss"]

    def log(self, step: int, stats) -> None:
        s, window_loss = jax.device_get((stats, self.loss_sum))
        self.loss_sum = jax.numpy.zeros((), np.float32)
        now = time.perf_counter()
        entry = {"step": step, "loss": float(s["loss"]),
                 "loss_avg": float(window_loss) / (step - self.win_step), "lr": float(s["lr"]),
                 "grad_norm": float(s["grad_norm"]),
                 "tokens_per_s": (step - self.win_step) * self.tokens_per_step
                 / max(now - self.win_t - self.paused, 1e-9),
                 "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed(),
                 "skipped_steps": int(s["skipped"]), "bad_steps": int(s["bad_steps"])}
        self.win_t, self.win_step, self.paused = now, step, 0.0
        self.write(entry, "train/")
        show_log(self.progress, entry)
        self.last.update(entry)

    def write(self, entry: dict, tb_prefix: str) -> None:
        if not self.start.primary:
            return
        self.metrics.write(entry)
        try:
            self.tb.scalars(entry["step"], {k: v for k, v in entry.items() if k != "step"},
                            prefix=tb_prefix)
            self.tb.flush()
        except OSError as e:
            raise WriteFailed(f"run.dir: cannot write {self.start.run_dir / 'tensorboard'} "
                              f"({os_reason(e)})") from e


class Evaluator:
    def __init__(self, start, eval_fn, batch_sharding, watchdog, reporter):
        self.start, self.eval_fn, self.sharding = start, eval_fn, batch_sharding
        self.watchdog, self.reporter = watchdog, reporter
        self.every = start.cfg.train.eval_every

    def maybe(self, step: int, params, stats) -> None:
        if not (self.every and step % self.every == 0):
            return
        eval_loss = self.reporter.timed(lambda: self.loss(params), sync=stats)
        t = self.start.cfg.train
        self.reporter.write({"step": step, "eval_loss": eval_loss,
                             "eval_tokens": t.eval_batches * self.reporter.tokens_per_step,
                             "elapsed_s": self.reporter.elapsed()}, "eval/")
        self.reporter.progress.line(f"eval step {step} | eval_loss {eval_loss:.4f}")
        self.reporter.last["eval_loss"] = eval_loss

    def loss(self, params) -> float:
        s, t = self.start, self.start.cfg.train
        loader = open_loader(s.cfg, "eval", s.local_batch, s.pidx, s.nproc)
        stalled = False
        try:
            feed = BatchFeed(loader, s.cfg.data, "eval", t.data_timeout_s)
            losses = []
            for i in range(t.eval_batches):
                try:
                    local = feed.next()
                except DataFailed:
                    stalled = True
                    raise
                batch = meshlib.place_batch(local, self.sharding, t.batch_size)
                losses.append(self.eval_fn(params, batch))
                self.watchdog.beat(f"eval batch {i + 1}")
            return float(np.mean([float(x) for x in jax.device_get(losses)]))
        finally:
            close_loader(loader, stalled)


def close_loader(loader, stalled: bool) -> None:
    """Close a loader; one whose source is stuck in a read is closed on a daemon thread (its
    prefetch thread cannot be joined)."""
    import threading

    if loader is None:
        return
    if stalled:
        threading.Thread(target=loader.close, name="nsa-data-close", daemon=True).start()
    else:
        loader.close()


class BadStepGuard:
    def __init__(self, max_bad: int, newest_note):
        self.max_bad, self.newest_note = max_bad, newest_note
        self.unchecked = collections.deque()   # (step, bad_steps on device), in step order
        self.completed: int | None = None      # the newest step whose result was read back

    def push(self, step: int, bad) -> None:
        self.unchecked.append((step, bad))

    def check(self, settle: bool, before: int | None = None) -> None:
        """Check, in order, the streak counters of finished steps (all of them if ``settle``;
        only steps ``< before`` if given)."""
        q = self.unchecked
        while q and (before is None or q[0][0] < before) and (settle or q[0][1].is_ready()):
            step, bad = q.popleft()
            bad = int(bad)                     # waits for the step (raises if it failed)
            self.completed = step
            if bad >= self.max_bad:
                raise TrainingFailed(
                    f"{bad} consecutive steps up to step {step} had a non-finite loss or "
                    f"gradient (train.max_bad_steps={self.max_bad}); lower train.lr or check "
                    f"the data; {self.newest_note()}")


class CheckpointPolicy:
    def __init__(self, start, ckpt, reporter, watchdog):
        self.start, self.ckpt, self.reporter, self.watchdog = start, ckpt, reporter, watchdog
        self.last_saved = start.step if start.resumed else None
        self.deferred = False        # a checkpoint waits for the end of a non-finite streak

    def maybe(self, step: int, state, stats) -> None:
        t = self.start.cfg.train
        if not (self.deferred or (t.ckpt_every and step % t.ckpt_every == 0)
                or step == t.steps):
            return
        streak = int(stats["bad_steps"])
        if streak and step != t.steps:
            if not self.deferred:
                self.reporter.progress.line(f"checkpoint of step {step} deferred: the last "
                                            f"{streak} step(s) were skipped (non-finite)")
            self.deferred = True
            return
        self.deferred = False
        self.reporter.timed(lambda: self.save(step, state), sync=stats)
        self.watchdog.beat(f"checkpoint {step}", step=step)

    def save(self, step: int, state) -> None:
        s = self.start
        meta = {"step": step, "tokens_seen": self.reporter.tokens_seen,
                "elapsed_s": self.reporter.elapsed(),
                "data": meshlib.gather_json(s.loader.state()), "config": s.cfg.to_dict()}
        self.ckpt.save(step, state, meta)
        self.last_saved = step

    def before_stop(self, done: int, state) -> str:
        """Checkpoint the last completed step (unless it is already saved); a note saying so."""
        where = self.start.ck_dir / str(done)
        if self.last_saved == done:
            self.ckpt.wait()
            return f"checkpoint {where} is the newest"
        if done == 0:
            return "no step was done, nothing to save"
        self.save(done, state)
        self.ckpt.wait()
        return f"checkpoint {where} written"

    def newest_note(self) -> str:
        """Where the run can be resumed from (waits for a checkpoint write in flight)."""
        try:
            self.ckpt.wait()
        except WriteFailed:
            pass
        newest = self.ckpt.latest_step()
        if newest is None:
            return "no checkpoint was written"
        return f"the newest complete checkpoint is step {newest} ({self.start.ck_dir / str(newest)})"
