"""The quality studies' training runs (bench/quality.py): each run is the product's own train
command in a subprocess (:class:`Job`, :func:`run_jobs`: one after another or all at once, under a
time budget that stops them with SIGTERM so they checkpoint), what each run recorded
(:func:`train_summary`), and the tokens the parity study trains on (:func:`prepare_parity`)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREPARE_CONFIG = "configs/quality_prepare.yaml"


class BenchError(Exception):
    """A failed step; printed as one line ``error: ...``."""


def log(msg: str) -> None:
    print(f"[quality] {msg}", flush=True)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def has_checkpoint(run_dir: Path) -> bool:
    ck = run_dir / "checkpoints"
    return ck.is_dir() and any(p.name.isdigit() for p in ck.iterdir())


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    return env


@dataclasses.dataclass
class Job:
    """One training run through the product's CLI, and what became of it."""

    study: str
    variant: str
    run_dir: Path
    cmd: list[str]
    log_path: Path | None = None      # parallel runs write their output here
    env: dict = dataclasses.field(default_factory=dict)   # extra environment (launcher detail)
    proc: subprocess.Popen | None = None
    t0: float = 0.0
    wall_s: float = 0.0
    rc: int | None = None
    stopped: str = ""                 # why the launcher stopped it ("" = it ended by itself)
    kill_at: float = math.inf         # monotonic time for SIGKILL after a SIGTERM

    @property
    def name(self) -> str:
        return f"{self.study}/{self.variant}"

    @property
    def failed(self) -> bool:
        """Ended badly by itself (a run the budget stopped is not a failure)."""
        return self.rc is not None and self.rc != 0 and not self.stopped


def _start(job: Job, log_to_file: bool) -> None:
    log(f"train {job.name}: {' '.join(job.cmd[1:])}"
        + (f" (output: {job.log_path})" if log_to_file else ""))
    out = None
    if log_to_file:
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(job.log_path, "ab")
    job.t0 = time.monotonic()
    try:
        job.proc = subprocess.Popen(job.cmd, cwd=ROOT, env={**child_env(), **job.env}, stdout=out,
                                    stderr=subprocess.STDOUT if out else None)
    finally:
        if out is not None:
            out.close()          # the child holds its own descriptor


def _finish(job: Job) -> None:
    job.rc = job.proc.returncode
    job.wall_s = time.monotonic() - job.t0
    rec = job.run_dir / "bench_train.json"
    if job.run_dir.is_dir():
        hist = json.loads(rec.read_text()) if rec.is_file() else []
        hist.append({"command": " ".join(["python", *job.cmd[1:]]), "wall_s": round(job.wall_s, 1),
                     "finished": now_iso(), "exit": job.rc,
                     **({"stopped": job.stopped} if job.stopped else {})})
        rec.write_text(json.dumps(hist, indent=1) + "\n")
    how = (f"stopped ({job.stopped}) after {job.wall_s:.0f}s, exit {job.rc}" if job.stopped
           else f"done in {job.wall_s:.0f}s" if job.rc == 0
           else f"FAILED (exit {job.rc}) after {job.wall_s:.0f}s"
           + (f"; see {job.log_path}" if job.log_path else ""))
    log(f"train {job.name}: {how}")


def _progress(job: Job) -> str:
    """``study/variant step N`` from the run's heartbeat (written every step)."""
    try:
        beat = json.loads((job.run_dir / "heartbeat.json").read_text())
        return f"{job.name} {beat.get('where', '')}".strip()
    except (OSError, ValueError):
        return f"{job.name} starting"


def run_jobs(jobs: list[Job], parallel: bool, budget_s: float | None, grace_s: float,
             status_every_s: float = 60.0) -> None:
    """Run ``jobs`` one after another or all at once. When ``budget_s`` seconds have passed,
    running jobs get SIGTERM (the trainer finishes its step, writes a checkpoint and exits 0),
    then SIGKILL after ``grace_s`` more; jobs not started yet are skipped."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    pending, running = list(jobs), []
    last_status = time.monotonic()
    while pending or running:
        now = time.monotonic()
        over = deadline is not None and now >= deadline
        while pending and (parallel or not running) and not over:
            job = pending.pop(0)
            _start(job, log_to_file=parallel)
            running.append(job)
        if over:
            for job in pending:
                job.stopped = "time budget: not started"
                log(f"train {job.name}: not started (--time-budget-s {budget_s:g} s is spent)")
            pending = []
            for job in running:
                if not job.stopped:
                    job.stopped = "time budget"
                    log(f"train {job.name}: --time-budget-s {budget_s:g} s spent; SIGTERM "
                        f"(checkpoint, then exit)")
                    job.proc.send_signal(signal.SIGTERM)
                    job.kill_at = now + grace_s
                elif now >= job.kill_at and job.proc.poll() is None:
                    log(f"train {job.name}: still running {grace_s:g} s after SIGTERM; SIGKILL")
                    job.proc.kill()
                    job.kill_at = float("inf")
        for job in list(running):
            if job.proc.poll() is not None:
                running.remove(job)
                _finish(job)
        if running and now - last_status >= status_every_s:
            last_status = now
            left = "" if deadline is None else f" | {max(0.0, deadline - now):.0f}s of budget left"
            log("running: " + "; ".join(_progress(j) for j in running) + left)
        if running:
            time.sleep(0.5)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise BenchError(f"{path}: not found (did the run start?)")
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def train_history(run_dir: Path) -> list[dict]:
    rec = run_dir / "bench_train.json"
    return json.loads(rec.read_text()) if rec.is_file() else []


def train_summary(run_dir: Path, cfg) -> dict:
    """What the run's own records say: steps, losses, throughput, time."""
    m = read_metrics(run_dir)
    train = [e for e in m if "loss" in e]
    evals = [e for e in m if "eval_loss" in e]
    hist = train_history(run_dir)
    tps = sorted(e["tokens_per_s"] for e in train[1:]) or [None]   # first window has compile
    return {"steps": train[-1]["step"] if train else 0,
            "final_loss": train[-1]["loss"] if train else None,
            "final_eval_loss": evals[-1]["eval_loss"] if evals else None,
            "train_elapsed_s": train[-1]["elapsed_s"] if train else None,
            "median_tokens_per_s": tps[len(tps) // 2],
            "command_wall_s": sum(h["wall_s"] for h in hist) if hist else None,
            "commands": [h["command"] for h in hist],
            "model": {k: getattr(cfg.model, k) for k in ("attention", "dim", "n_layers",
                                                         "n_heads", "n_kv_groups", "head_dim",
                                                         "vocab_size", "compute_dtype")},
            "nsa": cfg.to_dict()["nsa"], "seq_len": cfg.data.seq_len,
            "batch_size": cfg.train.batch_size, "lr": cfg.train.lr, "seed": cfg.train.seed}


def ensure_smoke_tokens(smoke_root: Path) -> Path:
    out = smoke_root / "tokens"
    if not (out / "index.json").is_file():
        cmd = [sys.executable, "-m", "nsa_jax.data.prepare", "--config",
               "configs/prepare_sample.yaml", f"data.out_dir={out}"]
        log(f"prepare: {' '.join(cmd[1:])}")
        if subprocess.run(cmd, cwd=ROOT, env=child_env()).returncode != 0:
            raise BenchError("preparing the bundled sample failed")
    return out


def read_text_any(path: Path) -> str:
    """UTF-8, else ISO-8859-1 (one Gutenberg file is Latin-1); CRLF -> LF."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n")


def stage_texts(inputs: list[str], out: Path, chunks: int) -> list[Path]:
    """Cut every input text into ``chunks`` pieces at line breaks, written as
    ``<k>_<name>.txt``: sorted by name, piece k of every text precedes piece k+1, so the tail of
    the prepared token stream (the tokens source's eval split) is the tail of every text."""
    files = []
    for p in map(Path, inputs):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.txt") if not f.name.upper().startswith("README"))
        elif p.is_file():
            files.append(p)
        else:
            raise BenchError(f"--texts: {p} does not exist")
    if not files:
        raise BenchError("--texts: no .txt files found")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in files:
        lines = read_text_any(f).splitlines(keepends=True)
        per = -(-len(lines) // chunks)
        for k in range(chunks):
            piece = "".join(lines[k * per:(k + 1) * per])
            if piece.strip():
                (out / f"{k:03d}_{f.stem}.txt").write_text(piece, encoding="utf-8")
    return files


def prepare_parity(args) -> None:
    from nsa_jax.config import load_config

    cfg = load_config(ROOT / PREPARE_CONFIG)
    staging = ROOT / cfg.data.path
    out = ROOT / cfg.data.out_dir
    if out.exists():
        raise BenchError(f"{out} already exists (remove it to prepare again)")
    files = stage_texts(args.texts, staging, args.chunks)
    log(f"staged {len(files)} texts as {args.chunks} pieces each in {staging}")
    cmd = [sys.executable, "-m", "nsa_jax.data.prepare", "--config", PREPARE_CONFIG]
    log(f"prepare: {' '.join(cmd[1:])}")
    if subprocess.run(cmd, cwd=ROOT, env=child_env()).returncode != 0:
        raise BenchError("prepare failed")
