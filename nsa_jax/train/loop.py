"""``train(cfg)``: check every input, then train, log, evaluate, checkpoint and resume.

Order of work (all user errors surface in steps 1-4, before any output is written or any
compute starts, and without touching existing checkpoints):

1. run directory: refuse to overwrite a run that has checkpoints unless ``run.resume=true``;
2. devices: the ('data', 'fsdp') mesh and batch divisibility;
3. on resume, the newest usable checkpoint: its metadata, the saved config's model/nsa sections
   against this one, shapes, then params, optimizer state, step and RNG with their checksums. A
   checkpoint that cannot be read back intact is named in a warning and the previous one is
   used (it is moved to ``corrupt_checkpoints/`` in step 5);
4. data: the train loader at the saved position, and a probe of the eval split;
5. write ``config.yaml`` / ``env.json`` (atomically), compile the step ahead of time, run.

While it runs (failure handling; the CLI maps the exceptions to exit statuses):

* SIGTERM / SIGINT (:mod:`~nsa_jax.train.signals`): the current step finishes, a checkpoint of
  it is written and ``train`` returns normally; a second signal ends the process at once.
* Non-finite loss or gradients: the update is skipped (``skipped_steps``, ``bad_steps`` in the
  metrics). Every step's streak counter is checked, in order, as soon as it is computed (polled
  without blocking, so the host never waits for the device; at log steps all are settled);
  ``train.max_bad_steps`` in a row raise :class:`TrainingFailed`. Checkpoints due during a
  streak are deferred to its end, so the newest checkpoint -- named in the message -- holds the
  state from before it and is never rotated away by states from inside it.
* Data (:mod:`~nsa_jax.train.feed`): a source that fails after its retries or stalls past
  ``train.data_timeout_s`` -- and bad data found mid-run -- stop the run after a checkpoint of
  the last completed step is written.
* Writes: a run output that cannot be written (disk full) raises :class:`WriteFailed` naming
  it and the newest complete checkpoint; small files are replaced atomically and partial
  checkpoints are never listed, so no state on disk is corrupt.
* Liveness (:mod:`~nsa_jax.train.watchdog`): ``heartbeat.json`` every step, ``kill -USR1``
  dumps stacks to ``stacks.txt``, ``run.watchdog_s`` aborts a hung run.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from pathlib import Path

import jax
import numpy as np
import yaml

from nsa_jax.config import Config
from nsa_jax.data import DataError
from nsa_jax.train import mesh as meshlib
from nsa_jax.errors import os_reason, warn
from nsa_jax.train.checkpoint import Checkpointer, checkpoint_dir
from nsa_jax.train.recovery import (NoUsableCheckpoint, check_compatible, newest_usable,
                                    quarantine)
from nsa_jax.train.env import collect_env
from nsa_jax.train.errors import (CheckpointError, DataFailed, TrainError, TrainingFailed,
                                  WriteFailed)
from nsa_jax.train.feed import BatchFeed, open_loader
from nsa_jax.train.files import atomic_write_text
from nsa_jax.train.metrics import MetricsLog, Progress, TensorBoardWriter, fmt_duration
from nsa_jax.train.optim import make_optimizer
from nsa_jax.train.signals import GracefulStop
from nsa_jax.train.state import ModelSpec, abstract_state, init_state
from nsa_jax.train.step import make_eval_step, make_train_step
from nsa_jax.train.watchdog import Watchdog

DEFAULT_PROFILE_STEPS = 3   # --profile traces this many steps, starting 2 steps after the start


def resolve_run_dir(cfg: Config) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    if cfg.run.resume:
        raise TrainError("run.resume: needs run.dir=<the run directory to continue>")
    if jax.process_count() > 1:
        raise TrainError("run.dir: required for multi-process runs (all processes must agree)")
    base = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def profile_window(cfg: Config, flag: bool, start: int) -> tuple[int, int] | None:
    """Inclusive [first, last] step numbers to trace (steps count from 1), or None."""
    total = cfg.train.steps
    if cfg.train.profile_steps is not None:
        a, b = cfg.train.profile_steps
        if a < 1 or b > total:
            raise TrainError(f"train.profile_steps: [{a}, {b}] must lie within steps 1..{total}")
        return (a, b) if b > start else None
    if flag:
        a = min(start + 3, total)
        return a, min(a + DEFAULT_PROFILE_STEPS - 1, total)
    return None


def _abstract_with(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def _close_loader(loader, stalled: bool) -> None:
    """Close a loader; one whose source is stuck in a read is closed on a daemon thread (its
    prefetch thread cannot be joined)."""
    if loader is None:
        return
    if stalled:
        threading.Thread(target=loader.close, name="nsa-data-close", daemon=True).start()
    else:
        loader.close()


class _Preflight:
    """Everything checked and loaded before any output or compute (steps 1-4)."""

    def __init__(self, cfg: Config, profile: bool):
        self.cfg = cfg
        t = cfg.train
        self.pidx, self.nproc = jax.process_index(), jax.process_count()
        self.run_dir = resolve_run_dir(cfg)
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise TrainError(f"run.dir: {self.run_dir} exists and is not a directory")
        self.ck_dir = checkpoint_dir(self.run_dir)
        self.loader = None
        self.meta = self.state = self.init_params = None
        self.init_note = ""
        self.bad_steps: list[int] = []       # corrupt checkpoints newer than the one restored
        reader = Checkpointer(self.ck_dir, read_only=True) if self.ck_dir.is_dir() else None
        try:
            latest = reader.latest_step() if reader else None
            if latest is not None and not cfg.run.resume:
                raise TrainError(f"run.dir: {self.run_dir} already has checkpoints (newest: step "
                                 f"{latest}); add run.resume=true to continue that run, or choose "
                                 f"another run.dir")
            if cfg.run.resume and latest is None:
                raise TrainError(f"run.resume: no checkpoint to resume from in {self.ck_dir}")
            if t.data_timeout_s and cfg.data.prefetch < 1:
                raise TrainError("train.data_timeout_s: needs data.prefetch >= 1 (the timeout "
                                 "waits on the prefetch thread)")

            self.mesh = meshlib.build_mesh(cfg.mesh)
            meshlib.check_batch(cfg, jax.device_count(), self.nproc)
            self.spec = ModelSpec(cfg.model, cfg.nsa, t.seed, cfg.exec)
            self.tx = make_optimizer(t)
            abstract = abstract_state(self.spec, self.tx, t.seed)
            self.shardings = meshlib.state_shardings(self.mesh, abstract)
            self.abstract = _abstract_with(abstract, self.shardings)

            if latest is not None:
                say = warn if self.pidx == 0 else (lambda msg: None)
                try:
                    _, (self.meta, self.state), self.bad_steps = newest_usable(
                        reader, lambda step: self._load(reader, step), say=say)
                except NoUsableCheckpoint as e:
                    raise NoUsableCheckpoint(f"{e}; {self._set_aside(e.bad_steps)}",
                                             e.bad_steps) from None
            elif t.init_from is not None:          # a resume keeps its own weights instead
                self._load_init_from(Path(t.init_from))
            self.start = int(self.meta["step"]) if self.meta else 0
            self.done = self.start >= t.steps
            self.window = profile_window(cfg, profile, self.start)
            if self.done:
                return

            self.local_batch = t.batch_size // self.nproc
            data_state = self.meta["data"][self.pidx] if self.meta is not None else None
            self.loader = open_loader(cfg, "train", self.local_batch, self.pidx, self.nproc,
                                      data_state)
            if t.eval_every:
                open_loader(cfg, "eval", self.local_batch, self.pidx, self.nproc).close()
        except BaseException:
            if self.loader is not None:
                self.loader.close()
            raise
        finally:
            if reader is not None:
                reader.close()

    def _set_aside(self, steps: list[int]) -> str:
        """Move every (unusable) checkpoint aside, so that the run can start afresh."""
        where = self.run_dir / "corrupt_checkpoints"
        if self.pidx == 0:
            try:
                quarantine(self.ck_dir, steps, self.run_dir)
            except OSError as e:
                return f"moving them to {where} failed ({os_reason(e)})"
        return (f"moved them to {where}; train again without run.resume=true to start this "
                f"run afresh")

    def _load_init_from(self, src: Path) -> None:
        """``train.init_from``: the newest usable checkpoint's parameters of run ``src``, placed
        like this run's; every problem is one error naming the key."""
        ck = checkpoint_dir(src)
        if not ck.is_dir():
            raise TrainError(f"train.init_from: {ck} not found (give the run directory of a run "
                             f"with checkpoints)")
        reader = Checkpointer(ck, read_only=True)
        try:
            if reader.latest_step() is None:
                raise TrainError(f"train.init_from: {ck} holds no checkpoint")
            say = warn if self.pidx == 0 else (lambda msg: None)
            step, self.init_params, _ = newest_usable(
                reader, lambda s: reader.restore_params(s, self.abstract.params,
                                                        reader.read_meta(s)), say=say)
        except CheckpointError as e:
            raise TrainError(f"train.init_from: {e} (model and nsa sections must give the same "
                             f"parameter shapes)") from None
        finally:
            reader.close()
        self.init_note = f" from the weights of {src} (step {step})"

    def _load(self, reader: Checkpointer, step: int):
        """``(meta, state)`` of checkpoint ``step``, read back in full (also when the run is
        already done: a corrupt final checkpoint is replaced by training from the previous)."""
        meta = reader.read_meta(step)
        check_compatible(self.run_dir, self.cfg, meta)
        states = meta.get("data")
        if step < self.cfg.train.steps and (not isinstance(states, list)
                                            or len(states) != self.nproc):
            n = len(states) if isinstance(states, list) else "?"
            raise TrainError(f"{reader.step_dir(step)}: written by {n} process(es); resume with "
                             f"the same number (now {self.nproc})")
        return meta, reader.restore_state(step, self.abstract, meta)


def train(cfg: Config, profile: bool = False, argv: list[str] | None = None) -> dict:
    """Run (or resume) training as configured. Returns a summary dict of the last metrics
    (with ``"stopped": "SIGTERM"`` when a signal ended it early)."""
    pre = _Preflight(cfg, profile)
    primary = pre.pidx == 0
    if pre.done:
        if primary:
            print(f"{pre.run_dir} is already at step {pre.start} >= train.steps={cfg.train.steps}; "
                  f"nothing to do (raise train.steps to train further)", flush=True)
        return {"step": pre.start}
    try:
        trainer = _Trainer(cfg, pre, primary, argv)
    except BaseException:
        pre.loader.close()
        raise
    return trainer.run()


class _Trainer:
    def __init__(self, cfg: Config, pre: _Preflight, primary: bool, argv):
        self.cfg, self.pre, self.primary = cfg, pre, primary
        t = cfg.train
        run_dir = pre.run_dir
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrainError(f"run.dir: cannot create {run_dir} ({os_reason(e)})") from None
        resolved = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
        self.metrics = MetricsLog(run_dir / "metrics.jsonl")
        self.tb = None
        if primary:
            self._quarantine()
            self._write_start(run_dir / "config.yaml",
                              lambda p: atomic_write_text(p, yaml.safe_dump(resolved.to_dict(),
                                                                            sort_keys=False)))
            self._write_start(run_dir / "env.json", lambda p: atomic_write_text(
                p, json.dumps(collect_env(argv), indent=2) + "\n"))
            self._write_start(self.metrics.path, lambda p: self.metrics.truncate_after(pre.start))
            # drops TensorBoard events of an earlier, interrupted attempt from this step on
            self.tb = self._write_start(run_dir / "tensorboard", lambda p: TensorBoardWriter(
                p, restart_step=pre.start + 1))
        if pre.nproc > 1 and pre.bad_steps:      # the moves are done before anyone writes
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("nsa_jax.train quarantine")
        self.ckpt = Checkpointer(pre.ck_dir, keep=t.ckpt_keep)
        self.batch_sharding = meshlib.batch_sharding(pre.mesh)
        self.repl = meshlib.replicated(pre.mesh)
        self.tokens_per_step = t.batch_size * cfg.data.seq_len
        self.progress = Progress(t.steps, pre.start, enabled=primary)
        self.watchdog = None
        self.last_saved = pre.start if pre.meta else None
        self.stalled = False

    @staticmethod
    def _write_start(path: Path, write):
        try:
            return write(path)
        except OSError as e:
            raise TrainError(f"run.dir: cannot write {path} ({os_reason(e)})") from None

    def _quarantine(self) -> None:
        pre = self.pre
        if not pre.bad_steps:
            return
        try:
            moved = quarantine(pre.ck_dir, pre.bad_steps, pre.run_dir)
        except OSError as e:
            raise TrainError(f"run.dir: cannot move the unusable checkpoints out of "
                             f"{pre.ck_dir} ({os_reason(e)})") from None
        for path in moved:
            warn(f"moved the unusable checkpoint {pre.ck_dir / path.name.split('-')[0]} to "
                 f"{path}")

    # ---- pieces --------------------------------------------------------------------------
    def _compile(self):
        pre, t = self.pre, self.cfg.train
        step_fn = jax.jit(make_train_step(pre.spec, t, pre.tx, pre.mesh, data=self.cfg.data),
                          in_shardings=(pre.shardings, self.batch_sharding),
                          out_shardings=(pre.shardings, self.repl), donate_argnums=0)
        batch = jax.ShapeDtypeStruct((t.batch_size, self.cfg.data.seq_len + 1), np.int32,
                                     sharding=self.batch_sharding)
        compiled = step_fn.lower(pre.abstract, batch).compile()
        self.eval_fn = jax.jit(make_eval_step(pre.spec, t.grad_accum, pre.mesh, data=self.cfg.data),
                               in_shardings=(pre.shardings.params, self.batch_sharding),
                               out_shardings=self.repl)
        return compiled

    def _place(self, local):
        return meshlib.place_batch(local, self.batch_sharding, self.cfg.train.batch_size)

    def _evaluate(self, params) -> float:
        pre, t = self.pre, self.cfg.train
        loader = open_loader(self.cfg, "eval", pre.local_batch, pre.pidx, pre.nproc)
        stalled = False
        try:
            feed = BatchFeed(loader, self.cfg.data, "eval", t.data_timeout_s)
            losses = []
            for i in range(t.eval_batches):
                try:
                    local = feed.next()
                except DataFailed:
                    stalled = True
                    raise
                losses.append(self.eval_fn(params, self._place(local)))
                self.watchdog.beat(f"eval batch {i + 1}")
            return float(np.mean([float(x) for x in jax.device_get(losses)]))
        finally:
            _close_loader(loader, stalled)

    def _save(self, step: int, state, tokens_seen: int, elapsed: float) -> None:
        meta = {"step": step, "tokens_seen": tokens_seen, "elapsed_s": elapsed,
                "data": meshlib.gather_json(self.pre.loader.state()),
                "config": self.cfg.to_dict()}
        self.ckpt.save(step, state, meta)
        self.last_saved = step

    def _log(self, entry: dict, tb_prefix: str) -> None:
        if not self.primary:
            return
        self.metrics.write(entry)
        try:
            self.tb.scalars(entry["step"], {k: v for k, v in entry.items() if k != "step"},
                            prefix=tb_prefix)
            self.tb.flush()
        except OSError as e:
            raise WriteFailed(f"run.dir: cannot write {self.pre.run_dir / 'tensorboard'} "
                              f"({os_reason(e)})") from e

    def _newest_note(self) -> str:
        """Where the run can be resumed from (waits for a checkpoint write in flight)."""
        with contextlib.suppress(WriteFailed):
            self.ckpt.wait()
        newest = self.ckpt.latest_step()
        if newest is None:
            return "no checkpoint was written"
        return f"the newest complete checkpoint is step {newest} ({self.pre.ck_dir / str(newest)})"

    def _check_streaks(self, unchecked, settle: bool, before: int | None = None) -> None:
        """Check, in order, the streak counters of finished steps (all of them if ``settle``;
        only steps ``< before`` if given)."""
        while unchecked and (before is None or unchecked[0][0] < before) and (
                settle or unchecked[0][1].is_ready()):
            step, bad = unchecked.popleft()
            self._check_streak(int(bad), step)

    def _check_streak(self, bad: int, step: int) -> None:
        t = self.cfg.train
        if bad >= t.max_bad_steps:
            raise TrainingFailed(
                f"{bad} consecutive steps up to step {step} had a non-finite loss or gradient "
                f"(train.max_bad_steps={t.max_bad_steps}); lower train.lr or check the data; "
                f"{self._newest_note()}")

    def _save_before_stop(self, done: int, state, tokens_seen: int, elapsed: float) -> str:
        """Checkpoint the last completed step (unless it is already saved); a note saying so."""
        if self.last_saved == done:
            self.ckpt.wait()
            return f"checkpoint {self.pre.ck_dir / str(done)} is the newest"
        if done == 0:
            return "no step was done, nothing to save"
        self._save(done, state, tokens_seen, elapsed)
        self.ckpt.wait()
        return f"checkpoint {self.pre.ck_dir / str(done)} written"

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        cfg, pre, t = self.cfg, self.pre, self.cfg.train
        last: dict = {}
        prof_dir = pre.run_dir / "profile"
        profiling = False
        stop = GracefulStop()
        state, done = None, pre.start
        tokens_seen = int(pre.meta["tokens_seen"]) if pre.meta else 0
        elapsed0 = float(pre.meta["elapsed_s"]) if pre.meta else 0.0
        t_start = time.perf_counter()
        try:
            self.watchdog = Watchdog(cfg.run.watchdog_s, pre.run_dir, pre.pidx, armed=False)
            self.watchdog.beat("compiling", step=pre.start)
            state = pre.state
            if state is None:
                state = jax.jit(lambda p: init_state(pre.spec, pre.tx, t.seed, p),
                                out_shardings=pre.shardings)(pre.init_params)
            n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
            self.progress.line(
                f"run dir {pre.run_dir} | {n_params:,} params | {jax.device_count()} x "
                f"{jax.devices()[0].platform} | mesh data={pre.mesh.shape['data']} "
                f"fsdp={pre.mesh.shape['fsdp']} | batch {t.batch_size} x {cfg.data.seq_len} | "
                + (f"resumed at step {pre.start}" if pre.meta else "fresh start" + pre.init_note))
            self.progress.line(f"pid {os.getpid()} | heartbeat {self.watchdog.heartbeat_path} | "
                               f"kill -USR1 {os.getpid()} writes all stacks to "
                               f"{self.watchdog.stacks_path}")
            t0 = time.perf_counter()
            step_fn = self._compile()
            self.progress.line(f"compiled the train step in {time.perf_counter() - t0:.1f}s")

            feed = BatchFeed(pre.loader, cfg.data, "train", t.data_timeout_s)
            wait_stop = stop.requested if pre.nproc == 1 else None
            t_start = time.perf_counter()
            win_t, win_step, paused = t_start, pre.start, 0.0
            loss_sum = jax.numpy.zeros((), np.float32)   # on device: no sync per step
            unchecked = collections.deque()   # (step, bad_steps on device), in step order
            deferred = False          # a checkpoint waits for the end of a non-finite streak
            stopped = False
            self.watchdog.arm()
            self.progress.start()
            for step in range(pre.start + 1, t.steps + 1):   # `step` = updates done after it
                if stop.agreed(sync_point=done % t.log_every == 0):
                    stopped = True
                    break
                try:
                    local = feed.next(wait_stop)
                except DataFailed:
                    self.stalled = True
                    raise
                if local is None:            # a signal arrived while waiting for data
                    stopped = self.stalled = True   # (the read may never return)
                    break
                if pre.window and step == pre.window[0]:
                    jax.profiler.start_trace(str(prof_dir), create_perfetto_trace=True)
                    profiling = True
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, stats = step_fn(state, self._place(local))
                done = step
                tokens_seen += self.tokens_per_step
                loss_sum = loss_sum + stats["loss"]
                if profiling and step == pre.window[1]:
                    p0 = time.perf_counter()
                    jax.block_until_ready(stats)
                    jax.profiler.stop_trace()
                    profiling = False
                    paused += time.perf_counter() - p0
                    self.progress.line(f"profile of steps {pre.window[0]}-{step} written to "
                                       f"{prof_dir}")
                self.progress.step()
                self.watchdog.beat(f"step {step}", step=step)
                unchecked.append((step, stats["bad_steps"]))
                log_step = step % t.log_every == 0 or step == t.steps
                # earlier steps first (a streak that ended there is not logged past)
                self._check_streaks(unchecked, settle=log_step, before=step)

                if log_step:
                    s, window_loss = jax.device_get((stats, loss_sum))
                    loss_sum = jax.numpy.zeros((), np.float32)
                    now = time.perf_counter()
                    entry = {"step": step, "loss": float(s["loss"]),
                             "loss_avg": float(window_loss) / (step - win_step),
                             "lr": float(s["lr"]),
                             "grad_norm": float(s["grad_norm"]),
                             "tokens_per_s": (step - win_step) * self.tokens_per_step
                             / max(now - win_t - paused, 1e-9),
                             "tokens_seen": tokens_seen,
                             "elapsed_s": elapsed0 + now - t_start,
                             "skipped_steps": int(s["skipped"]),
                             "bad_steps": int(s["bad_steps"])}
                    win_t, win_step, paused = now, step, 0.0
                    self._log(entry, "train/")
                    self.progress.log(entry)
                    last.update(entry)
                    self._check_streaks(unchecked, settle=True)

                if t.eval_every and step % t.eval_every == 0:
                    p0 = time.perf_counter()
                    eval_loss = self._evaluate(state.params)
                    now = time.perf_counter()
                    paused += now - p0
                    entry = {"step": step, "eval_loss": eval_loss,
                             "eval_tokens": t.eval_batches * self.tokens_per_step,
                             "elapsed_s": elapsed0 + now - t_start}
                    self._log(entry, "eval/")
                    self.progress.line(f"eval step {step} | eval_loss {eval_loss:.4f}")
                    last["eval_loss"] = eval_loss

                if deferred or (t.ckpt_every and step % t.ckpt_every == 0) or step == t.steps:
                    streak = int(stats["bad_steps"])
                    if streak and step != t.steps:
                        if not deferred:
                            self.progress.line(f"checkpoint of step {step} deferred: the last "
                                               f"{streak} step(s) were skipped (non-finite)")
                        deferred = True
                    else:
                        deferred = False
                        p0 = time.perf_counter()
                        self._save(step, state, tokens_seen,
                                   elapsed0 + time.perf_counter() - t_start)
                        paused += time.perf_counter() - p0
                        self.watchdog.beat(f"checkpoint {step}", step=step)
            self._check_streaks(unchecked, settle=True)
            if profiling:       # window ended past the last step
                jax.profiler.stop_trace()
                profiling = False
            if stopped:
                note = self._save_before_stop(done, state, tokens_seen,
                                              elapsed0 + time.perf_counter() - t_start)
                self.progress.close()
                if self.primary:
                    print(f"stopped by {stop.name} after step {done}: {note}; resume with "
                          f"run.resume=true", flush=True)
                return {**last, "step": done, "stopped": stop.name}
            self.watchdog.beat("final checkpoint")
            self.ckpt.wait()
            last_ckpt = self.ckpt.latest_step()
            self.progress.close()
            if self.primary:
                msg = (f"done: step {t.steps} | loss {last.get('loss', math.nan):.4f}"
                       + (f" | eval_loss {last['eval_loss']:.4f}" if "eval_loss" in last else "")
                       + f" | {fmt_duration(last.get('elapsed_s', 0.0))} | checkpoint "
                       f"{pre.ck_dir / str(last_ckpt)}")
                print(msg, flush=True)
            return last
        except (DataFailed, DataError) as e:
            # the state is that of step `done`, complete: save it so the run resumes there
            try:
                note = self._save_before_stop(done, state, tokens_seen,
                                              elapsed0 + time.perf_counter() - t_start)
                note = (f"stopped after step {done}; {note}" +
                        ("; resume with run.resume=true" if done else ""))
            except WriteFailed as w:
                note = f"writing a checkpoint of step {done} failed too: {w}"
            raise type(e)(f"{e}; {note}") from e
        except WriteFailed as e:
            raise WriteFailed(f"{e}; {self._newest_note()}") from e
        finally:
            stop.close()
            with contextlib.suppress(Exception):
                if profiling:
                    jax.profiler.stop_trace()
            if self.watchdog is not None:
                self.watchdog.close()
            self.progress.close()
            for cleanup in (self.ckpt.wait, self.ckpt.close, self.metrics.close,
                            (lambda: self.tb.close()) if self.tb is not None else None):
                if cleanup is not None:
                    with contextlib.suppress(Exception):   # errors were raised above
                        cleanup()
            _close_loader(pre.loader, self.stalled)
