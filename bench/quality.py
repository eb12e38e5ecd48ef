"""Does NSA learn? Long-range retrieval and loss parity with dense attention (issue 8).

Both studies train with the product's own command (``python -m nsa_jax.train``), one subprocess
per run, then evaluate the saved runs in this process:

* ``retrieval``: ``data.source: retrieval`` (key-value pairs scattered over an 8k context, queries
  at the end; layout in :mod:`nsa_jax.data.retrieval`). Three attentions from
  ``configs/quality_retrieval.yaml``: full NSA, window only (``nsa.branches=[win]``) and dense.
  Each run is restored with ``load_for_inference`` from its newest checkpoint and scored on
  held-out rows: argmax accuracy at every answer, binned by the distance from the query's key
  back to the pair's key, in multiples of the window w (bins ``(lo, hi]``). With n_layers stacked
  windows, information can travel at most n_layers * w tokens, so a window-only model of 4 layers
  is at chance beyond 4w.
* ``parity``: NSA and dense from ``configs/quality_parity.yaml`` on the same pretokenized tokens
  (``data.source: tokens``, seq 4096, same seed, so the same windows in the same order); held-out
  loss (``eval_loss`` in each run's ``metrics.jsonl``) against training tokens.

Results: ``<results>/quality_{retrieval,parity}_<device>.json`` and ``.png``. A report merges
with an existing JSON of the same study (rewritten after each variant, so a killed command keeps
what was done), so variants trained in separate sessions end up in one file (each entry records
its run's config, checkpoint step and whether the time budget stopped it). ``--smoke`` runs
everything at tiny sizes on any machine (about a minute on 2 CPU cores); its outputs go under
``runs/quality_smoke/`` (replaced each time) and its numbers mean nothing beyond "the pipeline
works". ``table`` prints a short table of the JSONs in ``--results``.

Reproduce on ONE GPU, one command (``bench/quality_gpu.sh``: 3 retrieval + 4 parity runs at the
same time, ``--parallel`` giving each 0.9/7 of the GPU memory; ``--time-budget-s`` stops runs
still going with SIGTERM -- the trainer checkpoints and exits 0 -- then evaluates them)::

    # once, on a machine with the texts (the 1 MB FineWeb-Edu sample text and the NLTK Gutenberg
    # books, not shipped here); then carry data_prepared/quality_parity (3.6 MB) to the GPU machine
    python3 bench/quality.py prepare-parity --texts DATA/fineweb_edu/fineweb_sample.txt \
        DATA/text/nltk_gutenberg                 # 1,805,591 tokens (measured: 11 s on 2 CPU cores)
    OUT=$OUT bench/quality_gpu.sh    # = python3 bench/quality.py all --parallel \
                                     #     --time-budget-s 450 --runs runs/quality --results $OUT
    # measured 304 s on an H200 (parity + an earlier 1500-step retrieval layout)
    bench/quality_gpu.sh --smoke     # the same on CPU at tiny sizes (7 runs): 98 s measured on 2 cores

Retrieval recipe, and what was measured (H200 runs: JSONs in ``bench/results/quality_attempts``;
CPU runs on 2 cores; seq 8192, w = 512, 4 layers, dim 256 unless said):

* values from one shared pool (a query needs an *induction* circuit: find the stored key, copy
  the token after it). Random filler, answers-only loss: chance (earlier probe). ``copy`` filler
  (half of the context copies of earlier stretches, long-range induction on every copied token),
  log or uniform distances, lr 1.5e-3 or 3e-3: chance after 1000-1500 steps (loss stayed at the
  unigram floor 7.30). ``copy`` + ``retrieval.filler_groups: 16`` (a skip-bigram that pays a
  previous-token head on its own): that head formed within ~500 steps (fresh-filler loss 7.3 ->
  4.9), the copying did not (copied tokens 5.1 nats after 1500 steps), dense as NSA. On CPU the
  same at seq 256 (dim 64, 1500 steps); ``repeat`` filler learned only at seq 64.
* key-owned values (``retrieval.values_per_key``): a query is one hop (attend to this key's value
  token, copy it). CPU, seq 256, dense: 100% of 2048 held-out answers after 1500 steps. At 8k,
  8 values per key, 3-token pairs, 3000 steps: NSA 11.2%, window 11.3%, dense 12.9% beyond 4w
  (chance 12.5%). A single value token in a compressed block of filler never taught the
  compressed scores to select its block (any gate init, any block size l >= 4, 6000 steps).
* the committed config: each pair a 34-token needle (``retrieval.value_repeat: 32``, the value
  fills a compressed block), gates initialised (cmp, slc, win) = (0.5, 0.95, 0.05)
  (``model.gate_bias``), lr 5e-4 (1.5e-3 left NSA at chance at 8k): NSA 97.3% beyond 4w,
  window 11.4%, dense 100%; 3000 steps each, 308 s for the three side by side on an H200::

    python3 bench/quality.py retrieval --parallel --time-budget-s 445

Sweeps and every attempt: bench/NOTES.md, "Retrieval study". ``--cpu-scale`` runs the one-hop
recipe at seq 256 (w = 16, so > 4w is (64, 256]; 10-token needles that fill its l = 8 blocks) on
a CPU::

    python bench/quality.py retrieval --cpu-scale --runs runs/quality_cpu \
        --device-tag cpu_scale --eval-rows 256 --eval-batch-size 64

Run directories default to ``runs/quality/<study>_<variant>``; a run whose directory already has
checkpoints is resumed (a finished one is a no-op), so an interrupted command can simply be
repeated. ``--set key=value`` adds overrides to every training run (e.g. ``train.steps=800``);
``--no-train`` only reports; ``--variants`` picks runs.
"""

import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # run as a script from a checkout: python bench/quality.py
    sys.path.insert(0, str(ROOT))

CONFIGS = {"retrieval": "configs/quality_retrieval.yaml", "parity": "configs/quality_parity.yaml"}
PREPARE_CONFIG = "configs/quality_prepare.yaml"
VARIANTS = {
    "retrieval": {"nsa": ["model.attention=nsa", "nsa.branches=[cmp,slc,win]"],
                  # the window branch's gate starts open (the config's gate_bias favours slc)
                  "win": ["model.attention=nsa", "nsa.branches=[win]", "model.gate_bias=[0,0,3]"],
                  "dense": ["model.attention=dense"]},
    # two seeds each (init and data order): the seed-to-seed spread is the noise floor that
    # an NSA - dense difference is read against
    "parity": {"nsa": ["model.attention=nsa"], "dense": ["model.attention=dense"],
               "nsa_s1": ["model.attention=nsa", "train.seed=1"],
               "dense_s1": ["model.attention=dense", "train.seed=1"]},
}
LABELS = {"nsa": "NSA (cmp+slc+win)", "win": "window only", "dense": "dense"}
COLORS = {"nsa": "tab:blue", "win": "tab:orange", "dense": "tab:green"}
PARITY_TOLERANCE = 0.02      # nats: NSA's held-out loss may exceed dense by at most this
RETRIEVAL_TARGET = 0.90      # NSA accuracy wanted at distances > 4w

# Tiny sizes for --smoke (CPU): the same code path, minutes -> seconds.
_SMOKE_MODEL = ["model.dim=64", "model.n_layers=2", "model.n_heads=2", "model.n_kv_groups=1",
                "model.head_dim=32", "model.mlp_hidden=128", "model.compute_dtype=float32",
                "nsa.block_l=16", "nsa.stride_d=8", "nsa.sel_block=16", "nsa.n_sel=3",
                "nsa.window=32", "train.batch_size=4", "train.steps=6", "train.warmup_steps=2",
                "train.log_every=2", "train.eval_every=3", "train.eval_batches=1",
                "train.ckpt_every=0", "data.prefetch=1"]
SMOKE = {
    "retrieval": _SMOKE_MODEL + ["model.vocab_size=256", "data.seq_len=256",
                                 "data.retrieval.pairs=8", "data.retrieval.queries=8",
                                 "data.retrieval.keys=8", "data.retrieval.values=64",
                                 "data.retrieval.value_repeat=8"],
    "parity": _SMOKE_MODEL + ["data.seq_len=128", "data.eval_fraction=0.1"],
}
SMOKE_ROWS = 8                # held-out retrieval rows scored in --smoke

# --cpu-scale: the retrieval recipe of configs/quality_retrieval.yaml shrunk to CPU sizes (seq
# 256, w = 16 so 4w = 64 < seq; needles of 8 values fill the l = 8 blocks; lr 2e-3 suits this
# dim-64 model; measured in bench/NOTES.md, "Retrieval study", set `needle`).
CPU_SCALE = ["model.vocab_size=512", "model.dim=64", "model.n_layers=2", "model.n_heads=2",
             "model.n_kv_groups=1", "model.head_dim=32", "model.mlp_hidden=192",
             "model.compute_dtype=float32", "nsa.window=16", "nsa.block_l=8", "nsa.stride_d=4",
             "nsa.sel_block=16", "nsa.n_sel=4", "nsa.n_local=1", "data.seq_len=256",
             "data.retrieval.pairs=8", "data.retrieval.queries=8", "data.retrieval.keys=32",
             "data.retrieval.values=256", "data.retrieval.values_per_key=8",
             "data.retrieval.value_repeat=8", "train.batch_size=32", "train.lr=2e-3",
             "train.warmup_steps=50", "train.steps=1500", "train.log_every=50",
             "train.eval_every=250", "train.ckpt_every=500"]


class BenchError(Exception):
    """A failed step; printed as one line ``error: ...``."""


def log(msg: str) -> None:
    print(f"[quality] {msg}", flush=True)


# ---- training through the product's CLI -----------------------------------------------------
def has_checkpoint(run_dir: Path) -> bool:
    ck = run_dir / "checkpoints"
    return ck.is_dir() and any(p.name.isdigit() for p in ck.iterdir())


def train_command(study: str, variant: str, run_dir: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "nsa_jax.train", "--config", CONFIGS[study],
           *VARIANTS[study][variant], f"run.dir={run_dir}", f"name={study}_{variant}", *extra]
    if has_checkpoint(run_dir):
        cmd.append("run.resume=true")
    return cmd


def _env() -> dict:
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


def make_job(study: str, variant: str, run_dir: Path, extra: list[str]) -> Job:
    return Job(study, variant, run_dir, train_command(study, variant, run_dir, extra))


def _start(job: Job, log_to_file: bool) -> None:
    log(f"train {job.name}: {' '.join(job.cmd[1:])}"
        + (f" (output: {job.log_path})" if log_to_file else ""))
    out = None
    if log_to_file:
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(job.log_path, "ab")
    job.t0 = time.monotonic()
    try:
        job.proc = subprocess.Popen(job.cmd, cwd=ROOT, env={**_env(), **job.env}, stdout=out,
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
                     "finished": _now(), "exit": job.rc,
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


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise BenchError(f"{path}: not found (did the run start?)")
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def train_summary(run_dir: Path, cfg) -> dict:
    """What the run's own records say: steps, losses, throughput, time."""
    m = read_metrics(run_dir)
    train = [e for e in m if "loss" in e]
    evals = [e for e in m if "eval_loss" in e]
    hist = _train_history(run_dir)
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


# ---- retrieval evaluation ---------------------------------------------------------------------
def make_predictor(model):
    """``predict(inputs [B,T], positions [B,Q]) -> argmax token after each position [B,Q]``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def fwd(state, inputs, positions):
        m = nnx.merge(graphdef, state)
        h = m(inputs)
        hq = jnp.take_along_axis(h, positions[..., None], axis=1)   # [B,Q,D]
        return jnp.argmax(m.head_logits(hq).astype(jnp.float32), axis=-1)

    def predict(inputs, positions):
        return jax.device_get(fwd(state, jnp.asarray(inputs, jnp.int32),
                                  jnp.asarray(positions, jnp.int32)))

    return predict


def evaluate_retrieval_run(run_dir: Path, rows: int, batch_size: int | None) -> dict:
    from nsa_jax.data import build_loader
    from nsa_jax.data.retrieval import RetrievalLayout
    from nsa_jax.data.retrieval_eval import evaluate_retrieval
    from nsa_jax.train.checkpoint import load_for_inference

    cfg, model = load_for_inference(run_dir)
    if cfg.data.source != "retrieval":
        raise BenchError(f"{run_dir}: trained on data.source={cfg.data.source}, not retrieval")
    layout = RetrievalLayout.from_config(cfg)
    bs = batch_size or cfg.train.batch_size
    n_batches = max(1, -(-rows // bs))
    predict = make_predictor(model)
    t0 = time.perf_counter()
    with build_loader(cfg, "eval", bs) as loader:
        res = evaluate_retrieval(predict, (next(loader).tokens for _ in range(n_batches)), layout,
                                 cfg.nsa.window)
    res["eval_rows"] = n_batches * bs
    res["eval_s"] = round(time.perf_counter() - t0, 1)
    res["layout"] = {k: getattr(layout, k) for k in ("seq_len", "pairs", "queries", "keys",
                                                     "values", "filler", "min_distance",
                                                     "max_distance", "filler_mode", "distance",
                                                     "period_min", "period_max", "query_marker",
                                                     "copy_fraction", "groups", "per_key")}
    res["train"] = train_summary(run_dir, cfg)
    return res


def binomial_upper(p: float, n: int, z: float = 3.0) -> float:
    return p + z * math.sqrt(p * (1 - p) / max(n, 1))


def retrieval_checks(variants: dict) -> dict:
    """The issue's criteria, computed (not asserted) from the measured numbers."""
    out = {}
    nsa, win = variants.get("nsa"), variants.get("win")
    if nsa and nsa["beyond_4w"]["accuracy"] is not None:
        out["nsa_beyond_4w_accuracy"] = nsa["beyond_4w"]["accuracy"]
        out[f"nsa_beyond_4w_ge_{RETRIEVAL_TARGET}"] = nsa["beyond_4w"]["accuracy"] >= \
            RETRIEVAL_TARGET
    if win and win["beyond_4w"]["accuracy"] is not None:
        b = win["beyond_4w"]
        out["win_beyond_4w_accuracy"] = b["accuracy"]
        out["win_beyond_4w_chance_3sigma"] = binomial_upper(win["chance"], b["n"])
        out["win_beyond_4w_at_chance"] = b["accuracy"] <= binomial_upper(win["chance"], b["n"])
    return out


def _wlabel(x: int, w: int) -> str:
    return "0" if x == 0 else ("w" if x == w else f"{x // w}w" if x % w == 0 else str(x))


def plot_retrieval(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [v for v in ("nsa", "win", "dense") if data["variants"].get(v)]
    if not present:
        return
    first = data["variants"][present[0]]
    w, chance = first["window"], first["chance"] * 100
    edges = [(b["lo"], b["hi"]) for b in first["bins"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for v in present:
        r = data["variants"][v]
        if [(b["lo"], b["hi"]) for b in r["bins"]] != edges:
            raise BenchError(f"retrieval plot: {v} was evaluated with other distance bins "
                             f"(window {r['window']} vs {w}); rerun its report")
        pts = [(i, b["accuracy"] * 100) for i, b in enumerate(r["bins"]) if b["n"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=COLORS[v], label=LABELS[v])
    ax.axhline(chance, color="gray", ls=":", label=f"chance ({chance:.2g}%)")
    beyond = [i for i, (lo, _) in enumerate(edges) if lo >= 4 * w]
    if beyond:
        ax.axvspan(beyond[0] - 0.5, len(edges) - 0.5, color="gray", alpha=0.08, lw=0,
                   label="distance > 4w")
    ax.set_xticks(range(len(edges)))
    ax.set_xticklabels([f"({_wlabel(lo, w)}, {_wlabel(hi, w)}]" for lo, hi in edges])
    ax.set_xlabel(f"distance from the query back to its key (w = window = {w} tokens)")
    ax.set_ylabel("answer accuracy (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(f"Retrieval accuracy against distance, seq {first['layout']['seq_len']} "
                 f"({data['device']}" + (", smoke" if data["smoke"] else "") + ")", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- parity ---------------------------------------------------------------------------------
def parity_entry(run_dir: Path) -> dict:
    from nsa_jax.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    m = read_metrics(run_dir)
    tps = cfg.train.batch_size * cfg.data.seq_len
    curve = [{"step": e["step"], "tokens": e["step"] * tps, "eval_loss": e["eval_loss"]}
             for e in m if "eval_loss" in e]
    if not curve:
        raise BenchError(f"{run_dir}/metrics.jsonl: no eval_loss entries (train.eval_every=0?)")
    train = [{"step": e["step"], "loss": e["loss"]} for e in m if "loss" in e]
    return {"eval_curve": curve, "train_curve": train, "train": train_summary(run_dir, cfg),
            "data_path": cfg.data.path}


def _pair_check(nsa: dict, dense: dict) -> dict:
    a = {c["step"]: c["eval_loss"] for c in nsa["eval_curve"]}
    b = {c["step"]: c["eval_loss"] for c in dense["eval_curve"]}
    common = sorted(set(a) & set(b))
    if not common:
        return {"note": "no common eval steps"}
    last = common[-1]
    diff = a[last] - b[last]
    return {"step": last, "nsa_eval_loss": a[last], "dense_eval_loss": b[last],
            "nsa_minus_dense": diff, f"within_{PARITY_TOLERANCE}": diff <= PARITY_TOLERANCE,
            "best_nsa_minus_best_dense": min(a[s] for s in common) - min(b[s] for s in common)}


def parity_checks(variants: dict) -> dict:
    """NSA - dense held-out loss at the last common eval step and best against best, for
    seed 0 (``nsa``/``dense``) and, where trained, seed 1 (``*_s1``, under ``"seed1"``); with
    both seeds also the seed-to-seed spread of each attention (``seed_spread``: |seed 0 -
    seed 1| of the best held-out loss), the noise floor of the comparison."""
    nsa, dense = variants.get("nsa"), variants.get("dense")
    if not (nsa and dense):
        return {}
    out = _pair_check(nsa, dense)
    if variants.get("nsa_s1") and variants.get("dense_s1"):
        out["seed1"] = _pair_check(variants["nsa_s1"], variants["dense_s1"])
        best = lambda v: min(c["eval_loss"] for c in variants[v]["eval_curve"])
        out["seed_spread"] = {"nsa": abs(best("nsa") - best("nsa_s1")),
                              "dense": abs(best("dense") - best("dense_s1"))}
        if "best_nsa_minus_best_dense" in out["seed1"]:
            out["best_nsa_minus_best_dense_mean"] = (out["best_nsa_minus_best_dense"] + out[
                "seed1"]["best_nsa_minus_best_dense"]) / 2
    return out


def plot_parity(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for v in ("nsa", "dense", "nsa_s1", "dense_s1"):
        r = data["variants"].get(v)
        if not r:
            continue
        c = r["eval_curve"]
        base, s1 = v.removesuffix("_s1"), v.endswith("_s1")
        ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c],
                "s--" if s1 else "o-", ms=3, color=COLORS[base], alpha=0.6 if s1 else 1.0,
                label=LABELS[base].split(" (")[0] + (" (seed 1)" if s1 else " (seed 0)"))
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("held-out loss (nats/token)")
    chk = data.get("checks") or {}
    sub = (f"; final NSA - dense = {chk['nsa_minus_dense']:+.3f}" if "nsa_minus_dense" in chk
           else "")
    ax.set_title(f"Held-out loss, seq {data.get('seq_len')} ({data['device']}"
                 + (", smoke" if data["smoke"] else "") + f"){sub}", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- reports ----------------------------------------------------------------------------------
def device_tag() -> str:
    import jax

    d = jax.devices()[0]
    if d.platform == "cpu":
        return "cpu"
    kind = re.sub(r"^nvidia\s+", "", d.device_kind.strip().lower())
    return re.sub(r"[^a-z0-9]+", "_", kind).strip("_") or d.platform


def device_desc() -> str:
    import jax

    d = jax.devices()
    return f"{len(d)} x {d[0].device_kind} ({d[0].platform}), jax {jax.__version__}"


def merge_results(path: Path, study: str, smoke: bool, device: str, fresh: dict) -> dict:
    """``fresh`` variants merged into the study's JSON at ``path`` (other variants are kept)."""
    old = {}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise BenchError(f"{path}: not valid JSON (remove it to start over)") from None
        if old.get("study") != study:
            raise BenchError(f"{path}: holds study {old.get('study')!r}, not {study!r}")
    variants = dict(old.get("variants") or {})
    variants.update(fresh)
    return {"study": study, "device": device, "smoke": smoke, "updated": _now(),
            "variants": variants}


def newest_checkpoint_step(run_dir: Path) -> int | None:
    ck = run_dir / "checkpoints"
    steps = [int(p.name) for p in ck.iterdir() if p.name.isdigit()] if ck.is_dir() else []
    return max(steps) if steps else None


def report(study: str, args, run_root: Path, results: Path) -> tuple[dict, list[str]]:
    """Evaluate every variant of ``study`` that has a checkpoint under ``run_root`` (a run
    stopped early counts: its newest checkpoint is used) and merge it into the study's JSON,
    written again after each variant (a command killed mid-report keeps what was done); then
    plot. Returns the data and the variants whose evaluation failed (the others are written)."""
    tag = args.device_tag or device_tag()
    json_path = results / f"quality_{study}_{tag}.json"
    results.mkdir(parents=True, exist_ok=True)
    data, errors = None, []
    for v in VARIANTS[study]:
        run_dir = run_root / f"{study}_{v}"
        if not has_checkpoint(run_dir):
            log(f"report {study}: no checkpoint in {run_dir}; {v} not (re)evaluated")
            continue
        log(f"report {study}: evaluating {v} from {run_dir}")
        t0 = time.perf_counter()
        try:
            if study == "retrieval":
                rows = SMOKE_ROWS if args.smoke else args.eval_rows
                entry = evaluate_retrieval_run(run_dir, rows, args.eval_batch_size)
            else:
                entry = parity_entry(run_dir)
        except Exception as e:      # one bad run must not lose the others' results
            errors.append(f"{study}/{v}: {type(e).__name__}: {e}")
            log(f"report {study}: {v} FAILED: {type(e).__name__}: {e}")
            continue
        entry["run_dir"] = str(run_dir)
        entry["checkpoint_step"] = newest_checkpoint_step(run_dir)
        hist = _train_history(run_dir)
        entry["stopped_by_budget"] = bool(hist and hist[-1].get("stopped"))
        entry["device"] = device_desc()
        entry["evaluated"] = _now()
        data = _write_study(json_path, study, args.smoke, tag, {v: entry})
        log(f"report {study}: {v} evaluated in {time.perf_counter() - t0:.0f}s")
    if data is None:
        if not json_path.is_file():
            raise BenchError(f"report {study}: no checkpoint under {run_root} and no {json_path}"
                             + (f" ({'; '.join(errors)})" if errors else ""))
        data = _write_study(json_path, study, args.smoke, tag, {})
    png = json_path.with_suffix(".png")
    (plot_retrieval if study == "retrieval" else plot_parity)(data, png)
    log(f"report {study}: wrote {json_path} and {png}")
    print_summary(data)
    return data, errors


def _write_study(json_path: Path, study: str, smoke: bool, tag: str, fresh: dict) -> dict:
    data = merge_results(json_path, study, smoke, tag, fresh)
    if study == "retrieval":
        data["checks"] = retrieval_checks(data["variants"])
    else:
        data["seq_len"] = next(iter(data["variants"].values()))["train"]["seq_len"]
        data["checks"] = parity_checks(data["variants"])
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(json_path)
    return data


def _train_history(run_dir: Path) -> list[dict]:
    rec = run_dir / "bench_train.json"
    return json.loads(rec.read_text()) if rec.is_file() else []


def print_summary(data: dict) -> None:
    if data["study"] == "retrieval":
        for v, r in data["variants"].items():
            bins = "  ".join(f"({b['lo']},{b['hi']}]:"
                             + (f"{b['accuracy']:.2f}" if b["n"] else "-") for b in r["bins"])
            log(f"retrieval {v:5s} beyond 4w {r['beyond_4w']['accuracy']} "
                f"(n={r['beyond_4w']['n']}, chance {r['chance']:.3g}) | {bins}")
    else:
        for v, r in data["variants"].items():
            c = r["eval_curve"][-1]
            log(f"parity {v:5s} step {c['step']} eval_loss {c['eval_loss']:.4f}")
    log(f"checks: {json.dumps(data.get('checks'))}")


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(results: Path, tag: str | None) -> None:
    """A short table of every study's JSON in ``results`` (``quality_<study>_<tag>.json``)."""
    found = False
    for study in ("retrieval", "parity"):
        paths = ([results / f"quality_{study}_{tag}.json"] if tag
                 else sorted(results.glob(f"quality_{study}_*.json")))
        for path in paths:
            if not path.is_file():
                continue
            found = True
            data = json.loads(path.read_text())
            print(f"== {path.name}" + (" (smoke)" if data.get("smoke") else ""))
            if study == "retrieval":
                print(f"{'variant':8s} {'step':>6s} {'<=w':>6s} {'>w':>6s} {'>4w':>6s} "
                      f"{'n>4w':>6s} {'chance':>7s} {'train_s':>8s} stopped")
                for v, r in data["variants"].items():
                    t = r["train"]
                    print(f"{v:8s} {r.get('checkpoint_step') or t['steps']:>6} "
                          f"{_fmt(r['within_w']['accuracy']):>6s} "
                          f"{_fmt(r['beyond_w']['accuracy']):>6s} "
                          f"{_fmt(r['beyond_4w']['accuracy']):>6s} {r['beyond_4w']['n']:>6} "
                          f"{r['chance']:>7.4f} {_fmt(t['train_elapsed_s'], '.0f'):>8s} "
                          f"{'yes' if r.get('stopped_by_budget') else 'no'}")
            else:
                print(f"{'variant':8s} {'step':>6s} {'eval_loss':>9s} {'best':>7s} "
                      f"{'tok/s':>9s} {'train_s':>8s} stopped")
                for v, r in data["variants"].items():
                    t, c = r["train"], r["eval_curve"]
                    print(f"{v:8s} {c[-1]['step']:>6} {c[-1]['eval_loss']:>9.4f} "
                          f"{min(e['eval_loss'] for e in c):>7.4f} "
                          f"{_fmt(t['median_tokens_per_s'], '.0f'):>9s} "
                          f"{_fmt(t['train_elapsed_s'], '.0f'):>8s} "
                          f"{'yes' if r.get('stopped_by_budget') else 'no'}")
            print(f"checks: {json.dumps(data.get('checks'))}")
    if not found:
        raise BenchError(f"table: no quality_*{'_' + tag if tag else ''}.json in {results}")


# ---- parity data --------------------------------------------------------------------------
def ensure_smoke_tokens(smoke_root: Path) -> Path:
    out = smoke_root / "tokens"
    if not (out / "index.json").is_file():
        cmd = [sys.executable, "-m", "nsa_jax.data.prepare", "--config",
               "configs/prepare_sample.yaml", f"data.out_dir={out}"]
        log(f"prepare: {' '.join(cmd[1:])}")
        if subprocess.run(cmd, cwd=ROOT, env=_env()).returncode != 0:
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
    if subprocess.run(cmd, cwd=ROOT, env=_env()).returncode != 0:
        raise BenchError("prepare failed")


# ---- main -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    study: str
    run_root: Path
    results: Path
    jobs: list[Job]


SMOKE_ROOT = ROOT / "runs" / "quality_smoke"


def results_dir(args) -> Path:
    return Path(args.results) if args.results else (SMOKE_ROOT / "results" if args.smoke
                                                    else ROOT / "bench" / "results")


def plan_study(study: str, args) -> Plan:
    smoke_root = SMOKE_ROOT
    run_root = Path(args.runs) if args.runs else (smoke_root if args.smoke
                                                  else ROOT / "runs" / "quality")
    results = results_dir(args)
    variants = args.variants or list(VARIANTS[study])
    if args.study == "all":
        variants = [v for v in variants if v in VARIANTS[study]]
    for v in variants:
        if v not in VARIANTS[study]:
            raise BenchError(f"--variants: {v!r} is not a {study} variant "
                             f"({', '.join(VARIANTS[study])})")
    jobs = []
    if not args.no_train:
        extra = list(SMOKE[study]) if args.smoke else []
        if args.cpu_scale:
            if study != "retrieval" or args.smoke:
                raise BenchError("--cpu-scale: only for the retrieval study, without --smoke")
            extra = list(CPU_SCALE)
        if study == "parity":
            if args.smoke:
                extra.append(f"data.path={ensure_smoke_tokens(smoke_root)}")
            else:
                check_parity_data(args.set)
        extra += args.set
        for v in variants:
            run_dir = run_root / f"{study}_{v}"
            if args.smoke and run_dir.is_dir():      # a smoke run always trains from scratch
                shutil.rmtree(run_dir)
            job = make_job(study, v, run_dir, extra)
            job.log_path = run_root / f"{study}_{v}.log"
            jobs.append(job)
    return Plan(study, run_root, results, jobs)


def check_parity_data(overrides: list[str]) -> None:
    """The parity runs' token shards exist (before anything starts)."""
    from nsa_jax.config import load_config

    path = Path(load_config(ROOT / CONFIGS["parity"], [o for o in overrides
                                                       if o.startswith("data.")]).data.path)
    path = path if path.is_absolute() else ROOT / path
    if not (path / "index.json").is_file():
        raise BenchError(f"parity data {path} not found: run `python3 bench/quality.py "
                         f"prepare-parity --texts ...` where the texts are and carry that folder")


def set_memory_shares(jobs: list[Job], fraction: float | None) -> None:
    """Concurrent jobs on one GPU: each child preallocates ``fraction`` of its memory (default
    0.9 / number of jobs) -- a launcher detail, set only in the children's environment."""
    share = fraction if fraction is not None else 0.9 / max(len(jobs), 1)
    for job in jobs:
        # one name only: jax 0.11 refuses to start its GPU backend (and falls back to the CPU)
        # when the newer XLA_CLIENT_MEM_FRACTION is set together with this older name, which
        # both jax 0.10 and 0.11 still read
        job.env.pop("XLA_CLIENT_MEM_FRACTION", None)
        job.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{share:.3f}"
    if jobs:
        log(f"{len(jobs)} runs at once, each with {share:.3f} of the GPU memory")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python bench/quality.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=["retrieval", "parity", "all", "prepare-parity", "table"])
    p.add_argument("--variants", nargs="+", metavar="V",
                   help="retrieval: nsa win dense; parity: nsa dense (default: all)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, outputs under runs/quality_smoke (checks the pipeline)")
    p.add_argument("--cpu-scale", action="store_true",
                   help="retrieval: the recipe shrunk to CPU sizes (seq 256, w 16, dim 64)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="extra overrides for every training run, e.g. train.steps=800")
    p.add_argument("--no-train", action="store_true", help="only evaluate and report")
    p.add_argument("--no-report", action="store_true", help="only train")
    p.add_argument("--parallel", action="store_true",
                   help="train all runs (of both studies with 'all') at the same time, sharing "
                        "the GPU; each run's output goes to <runs>/<study>_<variant>.log")
    p.add_argument("--mem-fraction", type=float, metavar="F",
                   help="with --parallel: GPU memory share of each run (default 0.9 / runs)")
    p.add_argument("--time-budget-s", type=float, metavar="S",
                   help="wall-clock seconds for all training; then running runs are stopped "
                        "(SIGTERM: checkpoint, exit), the rest skipped, and the report is made "
                        "from the newest checkpoints")
    p.add_argument("--stop-grace-s", type=float, default=90.0, metavar="S",
                   help="after that SIGTERM, seconds before SIGKILL (default 90)")
    p.add_argument("--runs", help="run directories root (default runs/quality)")
    p.add_argument("--results", help="JSON/PNG directory (default bench/results)")
    p.add_argument("--device-tag", help="file name tag (default from the device, e.g. h200)")
    p.add_argument("--eval-rows", type=int, default=128,
                   help="retrieval: held-out rows to score (default 128)")
    p.add_argument("--eval-batch-size", type=int, help="retrieval: rows per forward "
                   "(default train.batch_size)")
    p.add_argument("--texts", nargs="+", help="prepare-parity: .txt files or directories")
    p.add_argument("--chunks", type=int, default=20,
                   help="prepare-parity: pieces per text (default 20)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.study == "prepare-parity":
            if not args.texts:
                raise BenchError("prepare-parity: --texts is required")
            prepare_parity(args)
            return 0
        if args.time_budget_s is not None and args.time_budget_s <= 0:
            raise BenchError(f"--time-budget-s: must be > 0, got {args.time_budget_s:g}")
        if args.mem_fraction is not None and not 0 < args.mem_fraction <= 1:
            raise BenchError(f"--mem-fraction: must be in (0, 1], got {args.mem_fraction:g}")
        if args.study == "table":
            print_table(results_dir(args), args.device_tag)
            return 0
        studies = ["retrieval", "parity"] if args.study == "all" else [args.study]
        plans = [plan_study(s, args) for s in studies]
        jobs = [j for p in plans for j in p.jobs]
        if args.parallel:
            set_memory_shares(jobs, args.mem_fraction)
        else:
            for j in jobs:
                j.log_path = None             # one at a time: output on the console
        t0 = time.monotonic()
        run_jobs(jobs, args.parallel, args.time_budget_s, args.stop_grace_s)
        if jobs:
            log(f"training: {time.monotonic() - t0:.0f}s wall for {len(jobs)} runs")
        problems = [f"training {j.name} failed (exit {j.rc}"
                    + (f"; {j.log_path})" if j.log_path else ")") for j in jobs if j.failed]
        if not args.no_report:
            for p in sorted(plans, key=lambda p: p.study != "parity"):   # the quick one first
                try:
                    problems += report(p.study, args, p.run_root, p.results)[1]
                except BenchError as e:
                    problems.append(str(e))
                    log(f"error: {e}")
        if problems:
            raise BenchError("; ".join(problems))
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
