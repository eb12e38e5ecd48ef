"""Does sharded training follow single-device training? First-N-step losses through the train CLI.

    # on each machine: one training run of the product's own command, losses -> JSON
    python3 bench/loss_match.py run --tag 1gpu_a [--devices 0] [--set mesh.fsdp=2 ...]
    # here: compare every run with the first (the reference) -> bench/results/loss_match_<dev>.json
    python3 bench/loss_match.py compare RUN.json RUN.json ... [--out FILE]

``run`` pretokenizes the bundled FineWeb-Edu sample once (``python -m nsa_jax.data.prepare
--config configs/prepare_sample.yaml``) and trains ``--config`` (default ``configs/nsa_125m.yaml``)
for ``--steps`` steps (50) at the same global batch (``--batch`` 32, seq ``--seq`` 2048) with
``train.log_every=1``, so ``metrics.jsonl`` holds every step's loss. ``--devices`` sets
``CUDA_VISIBLE_DEVICES`` for the subprocess (the launcher's business, not the product's); the
mesh then spans the visible devices (``mesh.data=-1``). Warm-up is 10 steps so the loss moves
within the window. The run JSON keeps the per-step losses, the trainer's tokens/s, the device
count and the mesh.

``compare`` reports, for each run against the first: max and mean |loss difference| over the
steps, and the same for the final 10 steps. Run the reference configuration twice (two tags) to
measure the run-to-run noise floor: the compressed-branch backward adds float32 partial sums
with atomics, so even two single-GPU runs are not bit-identical, and bf16 compute magnifies it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def prepare(tok_dir: Path) -> None:
    if (tok_dir / "index.json").exists():
        return
    subprocess.run([sys.executable, "-m", "nsa_jax.data.prepare", "--config",
                    "configs/prepare_sample.yaml", f"data.out_dir={tok_dir}"], cwd=REPO,
                   check=True)


def run(a) -> int:
    tok = Path(a.data_dir)
    prepare(tok)
    run_dir = Path(a.runs) / a.tag
    if run_dir.exists():
        import shutil
        shutil.rmtree(run_dir)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if a.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = a.devices
    cmd = [sys.executable, "-m", "nsa_jax.train", "--config", a.config, "data.source=tokens",
           f"data.path={tok}", f"data.seq_len={a.seq}", f"train.batch_size={a.batch}",
           f"train.steps={a.steps}", "train.log_every=1", "train.warmup_steps=10",
           "train.eval_every=0", f"train.ckpt_every={a.steps}",
           f"run.dir={run_dir}", *a.set]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True)
    wall = time.perf_counter() - t0
    sys.stdout.write(r.stdout[-3000:])
    if r.returncode:
        sys.stderr.write(r.stderr[-3000:])
        return r.returncode
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in rows if "loss" in e]
    envj = json.loads((run_dir / "env.json").read_text())
    out = {"tag": a.tag, "config": a.config, "overrides": a.set, "batch": a.batch, "seq": a.seq,
           "device_count": envj.get("device_count"),
           "device": (envj.get("devices") or [{}])[0].get("kind"),
           "jax": envj.get("versions", {}).get("jax"), "wall_s": wall,
           "step": [e["step"] for e in steps], "loss": [e["loss"] for e in steps],
           "tokens_per_s": [e.get("tokens_per_s") for e in steps]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{a.tag}: {len(steps)} steps, loss {out['loss'][0]:.4f} -> {out['loss'][-1]:.4f}, "
          f"{wall:.0f}s; wrote {a.out}")
    return 0


def compare(a) -> int:
    runs = [json.loads(Path(p).read_text()) for p in a.runs_json]
    ref = runs[0]
    res = {"reference": ref["tag"], "runs": runs, "diffs": []}
    print(f"{'run':<14} {'devices':>7} {'steps':>5} {'max|dL|':>9} {'mean|dL|':>9} "
          f"{'max|dL| last10':>14} {'loss@last':>9}")
    for r in runs:
        n = min(len(r["loss"]), len(ref["loss"]))
        assert r["step"][:n] == ref["step"][:n], (r["tag"], "steps differ")
        d = [abs(x - y) for x, y in zip(r["loss"][:n], ref["loss"][:n])]
        row = {"tag": r["tag"], "steps": n, "max_abs": max(d), "mean_abs": sum(d) / n,
               "max_abs_last10": max(d[-10:]), "final_loss": r["loss"][n - 1],
               "device_count": r["device_count"]}
        res["diffs"].append(row)
        print(f"{r['tag']:<14} {r['device_count']!s:>7} {n:>5} {row['max_abs']:>9.4f} "
              f"{row['mean_abs']:>9.4f} {row['max_abs_last10']:>14.4f} {row['final_loss']:>9.4f}")
    # every pair: is a sharded run as close to each 1-device run as those are to each other?
    res["pairwise"] = []
    print(f"{'pair':<28} {'mean|dL|':>9} {'max|dL|':>9} {'mean dL':>9}")
    for i, r1 in enumerate(runs):
        for r2 in runs[i + 1:]:
            n = min(len(r1["loss"]), len(r2["loss"]))
            s = [y - x for x, y in zip(r1["loss"][:n], r2["loss"][:n])]
            row = {"a": r1["tag"], "b": r2["tag"], "steps": n,
                   "mean_abs": sum(map(abs, s)) / n, "max_abs": max(map(abs, s)),
                   "mean_signed": sum(s) / n}
            res["pairwise"].append(row)
            print(f"{r1['tag'] + ' vs ' + r2['tag']:<28} {row['mean_abs']:>9.4f} "
                  f"{row['max_abs']:>9.4f} {row['mean_signed']:>+9.4f}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tag", required=True)
    r.add_argument("--devices", help="CUDA_VISIBLE_DEVICES for the run, e.g. 0 or 0,1")
    r.add_argument("--config", default="configs/nsa_125m.yaml")
    r.add_argument("--steps", type=int, default=50)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--seq", type=int, default=2048)
    r.add_argument("--data-dir", default="data_prepared/fineweb_edu_sample")
    r.add_argument("--runs", default="runs/loss_match")
    r.add_argument("--set", nargs="*", default=[], help="extra key=value overrides")
    r.add_argument("--out", help="default: bench/results/loss_match_run_<tag>.json")
    c = sub.add_parser("compare")
    c.add_argument("runs_json", nargs="+")
    c.add_argument("--out")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        a.out = a.out or str(REPO / "bench" / "results" / f"loss_match_run_{a.tag}.json")
        return run(a)
    return compare(a)


if __name__ == "__main__":
    raise SystemExit(main())
