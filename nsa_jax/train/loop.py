"""``train(cfg)``: check every input, then train, log, evaluate, checkpoint and resume.

Reading order: :func:`train` -> :func:`~nsa_jax.train.start.preflight` (every input checked,
the starting point loaded, nothing written: one frozen :class:`~nsa_jax.train.start.Start`)
-> :class:`Trainer` (the run directory's files: :mod:`~nsa_jax.train.outputs`; compiles the step
ahead of time)
-> :meth:`Trainer.run`: per step, a batch (:mod:`~nsa_jax.train.feed`), the jitted update
(:mod:`~nsa_jax.train.step`), then the hooks of :mod:`~nsa_jax.train.hooks` in order:
profiler, bad-step guard, reporter (log steps), evaluator, checkpoint policy.

While it runs (failure handling; the CLI maps the exceptions to exit statuses):

* SIGTERM / SIGINT (:mod:`~nsa_jax.train.signals`): the current step finishes, a checkpoint of
  it is written and ``train`` returns normally; a second signal ends the process at once.
* Non-finite loss or gradients: the update is skipped (``skipped_steps``, ``bad_steps``);
  ``train.max_bad_steps`` in a row raise :class:`TrainingFailed`; checkpoints due during a
  streak are deferred to its end, so the newest checkpoint -- named in the message -- holds the
  state from before it.
* Data: a source that fails after its retries or stalls past ``train.data_timeout_s`` -- and
  bad data found mid-run -- stop the run after a checkpoint of the last completed step.
* Writes: a run output that cannot be written (disk full) raises :class:`WriteFailed` naming it
  and the newest complete checkpoint.
* Memory: an allocation that fails (XLA's ``RESOURCE_EXHAUSTED``, ``MemoryError``) raises
  :class:`OutOfMemory` naming the device, the step and the config keys that drive memory
  (:mod:`~nsa_jax.train.memory`).
* A fresh run that fails before any step is on record (no checkpoint, no metrics line, no step
  read back) leaves nothing half-written: the files it wrote at start-up are removed, and the run
  directory if this invocation created it (:func:`~nsa_jax.train.outputs.remove_start_outputs`;
  never on resume, never in a directory that existed before).
* Liveness (:mod:`~nsa_jax.train.watchdog`): ``heartbeat.json`` every step, ``kill -USR1``
  dumps stacks to ``stacks.txt``, ``run.watchdog_s`` aborts a hung run.
"""
from __future__ import annotations

import contextlib
import os
import time

import jax

from nsa_jax.config import Config, config_warnings
from nsa_jax.data import DataError
from nsa_jax.errors import warn
from nsa_jax.progress import Progress
from nsa_jax.train import mesh as meshlib
from nsa_jax.train.checkpoint import Checkpointer
from nsa_jax.train.errors import DataFailed, OutOfMemory, WriteFailed
from nsa_jax.train.feed import BatchFeed
from nsa_jax.train.hooks import (BadStepGuard, CheckpointPolicy, Evaluator, Profiler, Reporter,
                                 close_loader)
from nsa_jax.train.memory import is_out_of_memory, out_of_memory
from nsa_jax.train.metrics import final_line
from nsa_jax.train.outputs import is_new_run_dir, open_outputs, remove_start_outputs
from nsa_jax.train.signals import GracefulStop
from nsa_jax.train.start import Start, preflight, profile_window, resolve_run_dir  # noqa: F401
from nsa_jax.train.start import start_notes
from nsa_jax.train.state import init_state
from nsa_jax.train.step import batch_struct, make_eval_step, make_train_step
from nsa_jax.train.watchdog import Watchdog


def train(cfg: Config, profile: bool = False, argv: list[str] | None = None,
          notes: list[str] = ()) -> dict:
    """Run (or resume) training as configured. Returns a summary dict of the last metrics
    (with ``"stopped": "SIGTERM"`` when a signal ended it early). ``notes``: warnings from
    loading the config, printed once every input has been accepted."""
    t0 = time.perf_counter()
    try:
        start = preflight(cfg, profile)
    except Exception as e:
        if is_out_of_memory(e):          # e.g. restoring a checkpoint on resume
            raise out_of_memory(e, cfg, "while loading the run's starting point") from e
        raise
    if start.done:
        if start.primary:
            print(f"{start.run_dir} is already at step {start.step} >= train.steps="
                  f"{cfg.train.steps}; nothing to do (raise train.steps to train further)",
                  flush=True)
        return {"step": start.step}
    new_dir, trainer = is_new_run_dir(start), None   # before the Trainer creates it
    try:
        try:
            trainer = Trainer(start, argv, t0)
        except BaseException:
            start.loader.close()
            raise
        if start.primary:            # every input was accepted: now the warnings
            for note in [*notes, *config_warnings(cfg)]:
                warn(note)
        return trainer.run()
    except Exception as e:
        if new_dir and (trainer is None or trainer.completed is None):
            _note_on(e, remove_start_outputs(start.run_dir))
        raise


def _note_on(e: Exception, note: str | None) -> None:
    """Append ``note`` (what the clean-up removed) to an out-of-memory message, whose advice is
    to run again with other settings. Other errors keep their messages: the files went with a
    run that has nothing to resume."""
    if note and isinstance(e, OutOfMemory) and len(e.args) == 1:
        e.args = (f"{e}; {note}",)


class Trainer:
    def __init__(self, start: Start, argv, t_launch: float):
        self.s, self.t_launch = start, t_launch
        self.metrics, self.tb = open_outputs(start, argv)
        try:
            self.ckpt = Checkpointer(start.ck_dir, keep=start.cfg.train.ckpt_keep)
        except BaseException:
            if self.tb is not None:
                self.tb.close()
            raise
        self.batch_sharding = meshlib.batch_sharding(start.mesh)
        self.progress = Progress(start.cfg.train.steps, start.step, desc="train",
                                 enabled=start.primary)
        self.watchdog = self.stop = self.policy = self.profiler = self.guard = None
        self.stalled = False
        self.where = "while starting"       # for an out-of-memory message

    @property
    def completed(self) -> int | None:
        """The newest step known to have completed (its result read back), or None."""
        return self.guard.completed if self.guard is not None else None

    def _compile(self):
        s, t = self.s, self.s.cfg.train
        repl = meshlib.replicated(s.mesh)
        step_fn = jax.jit(make_train_step(s.spec, t, s.tx, s.mesh, data=s.cfg.data),
                          in_shardings=(s.shardings, self.batch_sharding),
                          out_shardings=(s.shardings, repl), donate_argnums=0)
        batch = batch_struct(s.cfg.data, t.batch_size, self.batch_sharding)
        compiled = step_fn.lower(s.abstract, batch).compile()
        eval_fn = jax.jit(make_eval_step(s.spec, t.grad_accum, s.mesh, data=s.cfg.data),
                          in_shardings=(s.shardings.params, self.batch_sharding),
                          out_shardings=repl)
        return compiled, eval_fn

    def _setup(self):
        """Watchdog, initial state, the start lines, compilation and the hooks."""
        s, t, cfg = self.s, self.s.cfg.train, self.s.cfg
        self.watchdog = Watchdog(cfg.run.watchdog_s, s.run_dir, s.pidx, armed=False)
        self.watchdog.on_signals(self.stop.woken)   # a second signal while blocked in C code
        self.watchdog.beat("compiling", step=s.step)
        state = s.state
        self.where = "while initialising the train state"
        if state is None:
            state = jax.jit(lambda p: init_state(s.spec, s.tx, t.seed, p),
                            out_shardings=s.shardings)(s.init_params)
        n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
        say = self.progress.line
        say(f"run dir {s.run_dir} | {n_params:,} params | {jax.device_count()} x "
            f"{jax.devices()[0].platform} | mesh data={s.mesh.shape['data']} "
            f"fsdp={s.mesh.shape['fsdp']} | batch {t.batch_size} x {cfg.data.seq_len} | "
            + (f"resumed at step {s.step}" if s.resumed else "fresh start" + s.init_note))
        say(f"pid {os.getpid()} | heartbeat {self.watchdog.heartbeat_path} | kill -USR1 "
            f"{os.getpid()} writes all stacks to {self.watchdog.stacks_path}")
        t0 = time.perf_counter()
        self.where = "while compiling the train step"
        step_fn, eval_fn = self._compile()
        say(f"compiled the train step in {time.perf_counter() - t0:.1f}s")
        for note in start_notes(s):
            say(note)
        self.reporter = Reporter(s, self.metrics, self.tb, self.progress)
        self.profiler = Profiler(s.window, s.run_dir / "profile", say)
        self.guard = BadStepGuard(t.max_bad_steps, lambda: self.policy.newest_note())
        self.evaluator = Evaluator(s, eval_fn, self.batch_sharding, self.watchdog, self.reporter)
        self.policy = CheckpointPolicy(s, self.ckpt, self.reporter, self.watchdog)
        return state, step_fn

    def run(self) -> dict:
        s, t = self.s, self.s.cfg.train
        self.stop, state, done = GracefulStop(), None, s.step
        try:
            state, step_fn = self._setup()
            feed = BatchFeed(s.loader, s.cfg.data, "train", t.data_timeout_s)
            wait_stop = self.stop.requested if s.nproc == 1 else None
            self.reporter.begin()
            self.watchdog.arm()
            self.progress.start()
            for step in range(s.step + 1, t.steps + 1):   # `step` = updates done after it
                if self.stop.agreed(sync_point=done % t.log_every == 0):
                    return self._stopped(done, state)
                local = self._next_batch(feed, wait_stop)
                if local is None:                          # a signal arrived while waiting
                    return self._stopped(done, state)
                self.where = None                          # in the train step
                self.profiler.before(step)
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    batch = meshlib.place_batch(local, self.batch_sharding, t.batch_size)
                    state, stats = step_fn(state, batch)
                done = step
                self._after_step(step, state, stats)
            return self._finished()
        except (DataFailed, DataError) as e:
            raise type(e)(f"{e}; {self._save_after_data_error(done, state)}") from e
        except WriteFailed as e:
            note = self.policy.newest_note() if self.policy else "no step was done"
            raise WriteFailed(f"{e}; {note}") from e
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            note = self.policy.newest_note() if self.policy else "no checkpoint was written"
            raise out_of_memory(e, s.cfg, self._where(), note) from e
        finally:
            self._close()

    def _after_step(self, step: int, state, stats) -> None:
        """The hooks, in order, once the update of ``step`` is dispatched."""
        t = self.s.cfg.train
        self.reporter.step(stats)
        self.reporter.pause(self.profiler.after(step, stats))
        self.progress.update()
        self.watchdog.beat(f"step {step}", step=step)
        self.guard.push(step, stats["bad_steps"])
        log_step = step % t.log_every == 0 or step == t.steps
        self.guard.check(settle=log_step, before=step)   # earlier steps first
        if log_step:
            self.reporter.log(step, stats)
            self.guard.check(settle=True)
        if t.eval_every and step % t.eval_every == 0:
            self.where = f"in the evaluation at step {step}"
        self.evaluator.maybe(step, state.params, stats)
        self.where = None
        self.policy.maybe(step, state, stats)

    def _where(self) -> str:
        """Where the run was for an out-of-memory message. Steps run ahead of the host: a
        step's failure shows when its result is read, so the failed step is the first one not
        known to have completed."""
        if self.where is not None:
            return self.where
        return f"in the train step (step {(self.completed or self.s.step) + 1})"

    def _next_batch(self, feed, wait_stop):
        try:
            local = feed.next(wait_stop)
        except DataFailed:
            self.stalled = True
            raise
        if local is None:
            self.stalled = True              # the read may never return
        return local

    def _finished(self) -> dict:
        self.guard.check(settle=True)
        self.profiler.finish()               # a window that ended past the last step
        self.watchdog.beat("final checkpoint")
        self.ckpt.wait()
        last, newest = self.reporter.last, self.ckpt.latest_step()
        self.progress.close()
        if self.s.primary:
            print(final_line(last, self.s.cfg.train.steps, self.s.ck_dir / str(newest),
                             time.perf_counter() - self.t_launch), flush=True)
        return last

    def _stopped(self, done: int, state) -> dict:
        self.guard.check(settle=True)
        self.profiler.finish()
        note = self.policy.before_stop(done, state)
        self.progress.close()
        if self.s.primary:
            print(f"stopped by {self.stop.name} after step {done}: {note}; resume with "
                  f"run.resume=true", flush=True)
        return {**self.reporter.last, "step": done, "stopped": self.stop.name}

    def _save_after_data_error(self, done: int, state) -> str:
        """The state is that of step ``done``, complete: save it so the run resumes there."""
        if self.policy is None:
            return "no step was done, nothing to save"
        try:
            note = self.policy.before_stop(done, state)
            return (f"stopped after step {done}; {note}"
                    + ("; resume with run.resume=true" if done else ""))
        except WriteFailed as w:
            return f"writing a checkpoint of step {done} failed too: {w}"

    def _close(self) -> None:
        if self.stop is not None:
            self.stop.close()
        with contextlib.suppress(Exception):
            if self.profiler is not None:
                self.profiler.finish()
        if self.watchdog is not None:
            self.watchdog.close()
        self.progress.close()
        for cleanup in (self.ckpt.wait, self.ckpt.close, self.metrics.close,
                        (lambda: self.tb.close()) if self.tb is not None else None):
            if cleanup is not None:
                with contextlib.suppress(Exception):   # errors were raised above
                    cleanup()
        close_loader(self.s.loader, self.stalled)

