"""``train(cfg)``: check every input, then train, log, evaluate, checkpoint and resume.

Order of work (all user errors surface in steps 1-4, before any output is written or any
compute starts, and without touching existing checkpoints):

1. run directory and checkpoints: refuse to overwrite a run that has checkpoints unless
   ``run.resume=true``; on resume read the newest checkpoint's metadata and check the saved
   config's model/nsa sections match this one;
2. devices: the ('data', 'fsdp') mesh and batch divisibility;
3. data: build the train loader (at the saved position on resume) and probe the eval split;
4. on resume, restore params, optimizer state, step and RNG (shape-checked);
5. write ``config.yaml`` / ``env.json``, compile the step ahead of time, run the loop.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import jax
import numpy as np

from nsa_jax.config import Config, save_config
from nsa_jax.data import build_loader
from nsa_jax.train import mesh as meshlib
from nsa_jax.train.checkpoint import Checkpointer, check_compatible, checkpoint_dir
from nsa_jax.train.env import collect_env
from nsa_jax.train.errors import TrainError, TrainingFailed
from nsa_jax.train.metrics import MetricsLog, Progress, TensorBoardWriter, fmt_duration
from nsa_jax.train.optim import make_optimizer
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
        reader = Checkpointer(self.ck_dir, read_only=True) if self.ck_dir.is_dir() else None
        try:
            latest = reader.latest_step() if reader else None
            if latest is not None and not cfg.run.resume:
                raise TrainError(f"run.dir: {self.run_dir} already has checkpoints (newest: step "
                                 f"{latest}); add run.resume=true to continue that run, or choose "
                                 f"another run.dir")
            if cfg.run.resume and latest is None:
                raise TrainError(f"run.resume: no checkpoint to resume from in {self.ck_dir}")
            self.meta = reader.read_meta(latest) if latest is not None else None
            if self.meta is not None:
                check_compatible(self.run_dir, cfg, self.meta)
                if self.meta.get("step") != latest:
                    raise TrainError(f"{reader.step_dir(latest)}/meta: records step "
                                     f"{self.meta.get('step')!r}, expected {latest}")
            self.start = int(self.meta["step"]) if self.meta else 0
            self.done = self.start >= t.steps

            self.mesh = meshlib.build_mesh(cfg.mesh)
            meshlib.check_batch(cfg, jax.device_count(), self.nproc)
            self.window = profile_window(cfg, profile, self.start)
            if self.done:
                return

            self.local_batch = t.batch_size // self.nproc
            data_state = None
            if self.meta is not None:
                states = self.meta.get("data")
                if not isinstance(states, list) or len(states) != self.nproc:
                    n = len(states) if isinstance(states, list) else "?"
                    raise TrainError(f"{reader.step_dir(latest)}: written by {n} process(es); "
                                     f"resume with the same number (now {self.nproc})")
                data_state = states[self.pidx]
            self.loader = build_loader(cfg, "train", self.local_batch, self.pidx, self.nproc,
                                       data_state)
            if t.eval_every:
                build_loader(cfg, "eval", self.local_batch, self.pidx, self.nproc).close()

            self.spec = ModelSpec(cfg.model, cfg.nsa, t.seed)
            self.tx = make_optimizer(t)
            abstract = abstract_state(self.spec, self.tx, t.seed)
            self.shardings = meshlib.state_shardings(self.mesh, abstract)
            self.abstract = _abstract_with(abstract, self.shardings)
            self.state = (reader.restore_state(latest, self.abstract)
                          if self.meta is not None else None)
        except BaseException:
            if self.loader is not None:
                self.loader.close()
            raise
        finally:
            if reader is not None:
                reader.close()


def train(cfg: Config, profile: bool = False, argv: list[str] | None = None) -> dict:
    """Run (or resume) training as configured. Returns a summary dict of the last metrics."""
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
            raise TrainError(f"run.dir: cannot create {run_dir} ({e.strerror})") from None
        resolved = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
        self.metrics = MetricsLog(run_dir / "metrics.jsonl")
        self.tb = None
        if primary:
            save_config(resolved, run_dir / "config.yaml")
            (run_dir / "env.json").write_text(json.dumps(collect_env(argv), indent=2) + "\n")
            self.metrics.truncate_after(pre.start)
            # drops TensorBoard events of an earlier, interrupted attempt from this step on
            self.tb = TensorBoardWriter(run_dir / "tensorboard", restart_step=pre.start + 1)
        self.ckpt = Checkpointer(pre.ck_dir, keep=t.ckpt_keep)
        self.batch_sharding = meshlib.batch_sharding(pre.mesh)
        self.repl = meshlib.replicated(pre.mesh)
        self.tokens_per_step = t.batch_size * cfg.data.seq_len
        self.progress = Progress(t.steps, pre.start, enabled=primary)
        self.watchdog = None

    # ---- pieces --------------------------------------------------------------------------
    def _compile(self):
        pre, t = self.pre, self.cfg.train
        step_fn = jax.jit(make_train_step(pre.spec, t, pre.tx, pre.mesh),
                          in_shardings=(pre.shardings, self.batch_sharding),
                          out_shardings=(pre.shardings, self.repl), donate_argnums=0)
        batch = jax.ShapeDtypeStruct((t.batch_size, self.cfg.data.seq_len + 1), np.int32,
                                     sharding=self.batch_sharding)
        compiled = step_fn.lower(pre.abstract, batch).compile()
        self.eval_fn = jax.jit(make_eval_step(pre.spec, t.grad_accum, pre.mesh),
                               in_shardings=(pre.shardings.params, self.batch_sharding),
                               out_shardings=self.repl)
        return compiled

    def _batch(self, loader):
        return meshlib.place_batch(next(loader), self.batch_sharding, self.cfg.train.batch_size)

    def _evaluate(self, params) -> float:
        pre, t = self.pre, self.cfg.train
        loader = build_loader(self.cfg, "eval", pre.local_batch, pre.pidx, pre.nproc)
        try:
            losses = []
            for i in range(t.eval_batches):
                losses.append(self.eval_fn(params, self._batch(loader)))
                self.watchdog.beat(f"eval batch {i + 1}")
            return float(np.mean([float(x) for x in jax.device_get(losses)]))
        finally:
            loader.close()

    def _save(self, step: int, state, tokens_seen: int, elapsed: float) -> None:
        meta = {"step": step, "tokens_seen": tokens_seen, "elapsed_s": elapsed,
                "data": meshlib.gather_json(self.pre.loader.state()),
                "config": self.cfg.to_dict()}
        self.ckpt.save(step, state, meta)

    def _log(self, entry: dict, tb_prefix: str) -> None:
        if not self.primary:
            return
        self.metrics.write(entry)
        self.tb.scalars(entry["step"], {k: v for k, v in entry.items() if k != "step"},
                        prefix=tb_prefix)
        self.tb.flush()

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        cfg, pre, t = self.cfg, self.pre, self.cfg.train
        last: dict = {}
        prof_dir = pre.run_dir / "profile"
        profiling = False
        try:
            state = pre.state
            if state is None:
                state = jax.jit(lambda: init_state(pre.spec, pre.tx, t.seed),
                                out_shardings=pre.shardings)()
            n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
            self.progress.line(
                f"run dir {pre.run_dir} | {n_params:,} params | {jax.device_count()} x "
                f"{jax.devices()[0].platform} | mesh data={pre.mesh.shape['data']} "
                f"fsdp={pre.mesh.shape['fsdp']} | batch {t.batch_size} x {cfg.data.seq_len} | "
                + (f"resumed at step {pre.start}" if pre.meta else "fresh start"))
            t0 = time.perf_counter()
            step_fn = self._compile()
            self.progress.line(f"compiled the train step in {time.perf_counter() - t0:.1f}s")

            tokens_seen = int(pre.meta["tokens_seen"]) if pre.meta else 0
            elapsed0 = float(pre.meta["elapsed_s"]) if pre.meta else 0.0
            t_start = time.perf_counter()
            win_t, win_step, paused = t_start, pre.start, 0.0
            loss_sum = jax.numpy.zeros((), np.float32)   # on device: no sync per step
            self.watchdog = Watchdog(cfg.run.watchdog_s)
            self.progress.start()
            for step in range(pre.start + 1, t.steps + 1):   # `step` = updates done after it
                if pre.window and step == pre.window[0]:
                    jax.profiler.start_trace(str(prof_dir), create_perfetto_trace=True)
                    profiling = True
                batch = self._batch(pre.loader)
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, stats = step_fn(state, batch)
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
                self.watchdog.beat(f"step {step}")

                if step % t.log_every == 0 or step == t.steps:
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
                             "skipped_steps": int(s["skipped"])}
                    win_t, win_step, paused = now, step, 0.0
                    self._log(entry, "train/")
                    self.progress.log(entry)
                    last.update(entry)
                    if int(s["bad_steps"]) >= t.max_bad_steps:
                        raise TrainingFailed(
                            f"{int(s['bad_steps'])} consecutive steps up to step {step} had a "
                            f"non-finite loss or gradient (train.max_bad_steps="
                            f"{t.max_bad_steps}); lower train.lr or check the data")

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

                if (t.ckpt_every and step % t.ckpt_every == 0) or step == t.steps:
                    p0 = time.perf_counter()
                    self._save(step, state, tokens_seen,
                               elapsed0 + time.perf_counter() - t_start)
                    paused += time.perf_counter() - p0
                    self.watchdog.beat(f"checkpoint {step}")
            if profiling:       # window ended past the last step
                jax.profiler.stop_trace()
                profiling = False
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
        finally:
            if profiling:
                jax.profiler.stop_trace()
            if self.watchdog is not None:
                self.watchdog.close()
            self.progress.close()
            self.ckpt.wait()
            self.ckpt.close()
            pre.loader.close()
            self.metrics.close()
            if self.tb is not None:
                self.tb.close()
