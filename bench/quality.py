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

Beside this file: ``quality_runs.py`` (the training subprocesses, their records, the parity
tokens) and ``quality_eval.py`` (retrieval accuracy, loss parity, their plots).
"""

import argparse
import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "bench"):    # nsa_jax from a checkout; the quality_* modules beside this one
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from quality_eval import (evaluate_retrieval_run, parity_checks, parity_entry,  # noqa: E402
                          plot_parity, plot_retrieval, retrieval_checks)
from quality_runs import (BenchError, Job, ensure_smoke_tokens, has_checkpoint, log,  # noqa: E402
                          now_iso, prepare_parity, run_jobs, train_history)

CONFIGS = {"retrieval": "configs/quality_retrieval.yaml", "parity": "configs/quality_parity.yaml"}
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


# ---- training through the product's CLI (the launcher: bench/quality_runs.py) ---------------
def train_command(study: str, variant: str, run_dir: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "nsa_jax.train", "--config", CONFIGS[study],
           *VARIANTS[study][variant], f"run.dir={run_dir}", f"name={study}_{variant}", *extra]
    if has_checkpoint(run_dir):
        cmd.append("run.resume=true")
    return cmd


def make_job(study: str, variant: str, run_dir: Path, extra: list[str]) -> Job:
    return Job(study, variant, run_dir, train_command(study, variant, run_dir, extra))


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
    return {"study": study, "device": device, "smoke": smoke, "updated": now_iso(),
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
        hist = train_history(run_dir)
        entry["stopped_by_budget"] = bool(hist and hist[-1].get("stopped"))
        entry["device"] = device_desc()
        entry["evaluated"] = now_iso()
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
