"""Before any output or compute: check every input and load what the run starts from.

:func:`preflight` does, in order (each user error is one line, nothing is written):

1. run directory: refuse to overwrite a run that has checkpoints unless ``run.resume=true``;
2. devices: the ('data', 'fsdp') mesh and batch divisibility;
3. on resume, the newest usable checkpoint: its metadata, the saved config's model/nsa sections
   against this one, shapes, then params, optimizer state, step and RNG with their checksums
   (a corrupt one is named in a warning and the previous one is used, and moved to
   ``corrupt_checkpoints/`` once training starts; if none is usable, one error line names
   every step and nothing is moved);
   or, with ``train.init_from``, another run's weights;
4. data: the train loader at the saved position, and a probe of the eval split;
5. with ``exec.compile_cache``, JAX's persistent compilation cache in that directory
   (:mod:`nsa_jax.compile_cache`; JAX creates it at its first entry).

It returns one frozen :class:`Start` record; the loop reads everything it starts from there.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax

from nsa_jax import compile_cache
from nsa_jax.config import Config
from nsa_jax.data import DataError
from nsa_jax.errors import warn
from nsa_jax.train import mesh as meshlib
from nsa_jax.train.checkpoint import Checkpointer, checkpoint_dir
from nsa_jax.train.errors import CheckpointError, TrainError
from nsa_jax.train.feed import open_loader
from nsa_jax.train.optim import lr_at, make_optimizer
from nsa_jax.train.recovery import NoUsableCheckpoint, check_compatible, newest_usable
from nsa_jax.train.state import ModelSpec, abstract_state

DEFAULT_PROFILE_STEPS = 3   # --profile traces this many steps, starting 2 steps after the start


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts: everything checked and loaded before any output or compute."""
    cfg: Config
    run_dir: Path
    ck_dir: Path
    pidx: int                      # this process's index, and the number of processes
    nproc: int
    mesh: Any
    spec: ModelSpec
    tx: Any                        # the optax optimizer
    shardings: Any                 # TrainState of shardings
    abstract: Any                  # TrainState of ShapeDtypeStructs (with shardings)
    step: int                      # updates done (0 on a fresh start)
    resumed: bool
    tokens_seen: int
    elapsed_s: float               # training time of earlier attempts
    saved_steps: int | None        # the checkpoint's train.steps (None: fresh)
    state: Any = None              # the restored TrainState, or None (initialise)
    init_params: Any = None        # train.init_from: the weights to start from
    init_note: str = ""
    bad_steps: tuple[int, ...] = ()   # corrupt checkpoints newer than the one restored
    window: tuple[int, int] | None = None   # steps to profile
    loader: Any = None             # the train loader at the data position (None when done)

    @property
    def done(self) -> bool:
        return self.step >= self.cfg.train.steps

    @property
    def primary(self) -> bool:
        return self.pidx == 0

    @property
    def local_batch(self) -> int:
        return self.cfg.train.batch_size // self.nproc


def start_notes(s: Start) -> list[str]:
    """What the start lines should say about the schedule and evaluation."""
    t, out = s.cfg.train, []
    if s.resumed and s.saved_steps is not None and s.saved_steps != t.steps:
        old = dataclasses.replace(t, steps=s.saved_steps)
        out.append(f"train.steps: {s.saved_steps} -> {t.steps} on resume reshapes the learning-"
                   f"rate schedule: the next update's lr was {float(lr_at(s.step, old)):.3g}, now "
                   f"{float(lr_at(s.step, t)):.3g}")
    if t.eval_every == 0 or t.eval_every > t.steps:
        out.append(f"no evaluation will run (train.eval_every={t.eval_every}, train.steps="
                   f"{t.steps}): no held-out loss")
    return out


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


def preflight(cfg: Config, profile: bool = False) -> Start:
    """Check every input and load the starting point (see the module docstring)."""
    t, pidx, nproc = cfg.train, jax.process_index(), jax.process_count()
    run_dir = resolve_run_dir(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise TrainError(f"run.dir: {run_dir} exists and is not a directory")
    ck_dir = checkpoint_dir(run_dir)
    say = warn if pidx == 0 else (lambda msg: None)
    reader = Checkpointer(ck_dir, read_only=True) if ck_dir.is_dir() else None
    loader = None
    try:
        latest = reader.latest_step() if reader else None
        if latest is not None and not cfg.run.resume:
            raise TrainError(f"run.dir: {run_dir} already has checkpoints (newest: step {latest}); "
                             f"add run.resume=true to continue that run, or choose another "
                             f"run.dir")
        if cfg.run.resume and latest is None:
            raise TrainError(f"run.resume: no checkpoint to resume from in {ck_dir}")
        if t.data_timeout_s and cfg.data.prefetch < 1:
            raise TrainError("train.data_timeout_s: needs data.prefetch >= 1 (the timeout waits "
                             "on the prefetch thread)")
        mesh = meshlib.build_mesh(cfg.mesh)
        meshlib.check_batch(cfg, jax.device_count(), nproc)
        spec = ModelSpec(cfg.model, cfg.nsa, t.seed, cfg.exec)
        tx = make_optimizer(t)
        abstract = abstract_state(spec, tx, t.seed)
        shardings = meshlib.state_shardings(mesh, abstract)
        abstract = _abstract_with(abstract, shardings)
        meta, state, bad, init_params, init_note = None, None, [], None, ""
        if latest is not None:
            try:
                _, (meta, state), bad = newest_usable(
                    reader, lambda s: _load(cfg, run_dir, reader, s, abstract, nproc), say=say)
            except NoUsableCheckpoint as e:
                raise NoUsableCheckpoint(f"{e}; {_none_usable(run_dir)}", e.bad_steps) from None
        elif t.init_from is not None:          # a resume keeps its own weights instead
            init_params, init_note = _init_from(Path(t.init_from), abstract, say)
        step = int(meta["step"]) if meta else 0
        window = profile_window(cfg, profile, step)
        if step < t.steps:
            data_state = meta["data"][pidx] if meta is not None else None
            loader = open_loader(cfg, "train", t.batch_size // nproc, pidx, nproc, data_state)
            if t.eval_every:
                _probe_eval(cfg, pidx, nproc)
        saved = ((meta or {}).get("config") or {}).get("train") or {}
        if cfg.exec.compile_cache is not None:
            try:
                compile_cache.enable(cfg.exec.compile_cache)
            except compile_cache.CompileCacheError as e:
                raise TrainError(str(e)) from None
        return Start(cfg=cfg, run_dir=run_dir, ck_dir=ck_dir, pidx=pidx, nproc=nproc, mesh=mesh,
                     spec=spec, tx=tx, shardings=shardings, abstract=abstract, step=step,
                     resumed=meta is not None,
                     tokens_seen=int(meta["tokens_seen"]) if meta else 0,
                     elapsed_s=float(meta["elapsed_s"]) if meta else 0.0,
                     saved_steps=saved.get("steps") if meta else None, state=state,
                     init_params=init_params, init_note=init_note, bad_steps=tuple(bad),
                     window=window, loader=loader)
    except BaseException:
        if loader is not None:
            loader.close()
        raise
    finally:
        if reader is not None:
            reader.close()


def _probe_eval(cfg: Config, pidx: int, nproc: int) -> None:
    """The eval split opens and holds a batch, or a DataError naming ``train.eval_every``."""
    t = cfg.train
    try:
        open_loader(cfg, "eval", t.batch_size // nproc, pidx, nproc).close()
    except DataError as e:
        raise DataError(f"{e}; train.eval_every={t.eval_every} needs an eval split "
                        f"(train.eval_every=0 trains without evaluation)") from None


def _load(cfg, run_dir, reader: Checkpointer, step: int, abstract, nproc: int):
    """``(meta, state)`` of checkpoint ``step``, read back in full (also when the run is
    already done: a corrupt final checkpoint is replaced by training from the previous)."""
    meta = reader.read_meta(step)
    check_compatible(run_dir, cfg, meta)
    states = meta.get("data")
    if step < cfg.train.steps and (not isinstance(states, list) or len(states) != nproc):
        n = len(states) if isinstance(states, list) else "?"
        raise TrainError(f"{reader.step_dir(step)}: written by {n} process(es); resume with "
                         f"the same number (now {nproc})")
    return meta, reader.restore_state(step, abstract, meta)


def _none_usable(run_dir: Path) -> str:
    """What to do when no checkpoint is usable (they are left in place, for inspection)."""
    return (f"all are left in {checkpoint_dir(run_dir)}; to start afresh, choose another "
            f"run.dir")


def _init_from(src: Path, abstract, say) -> tuple[Any, str]:
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
        step, params, _ = newest_usable(
            reader, lambda s: reader.restore_params(s, abstract.params, reader.read_meta(s)),
            say=say)
    except CheckpointError as e:
        raise TrainError(f"train.init_from: {e} (model and nsa sections must give the same "
                         f"parameter shapes)") from None
    finally:
        reader.close()
    return params, f" from the weights of {src} (step {step})"
