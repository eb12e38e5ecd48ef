"""The quality studies' measures (bench/quality.py): retrieval accuracy of a saved run by
distance (:func:`evaluate_retrieval_run`, :func:`retrieval_checks`), held-out loss parity of NSA
and dense (:func:`parity_entry`, :func:`parity_checks`), and their plots."""
from __future__ import annotations

import math
import time
from pathlib import Path

from quality_runs import BenchError, read_metrics, train_summary

LABELS = {"nsa": "NSA (cmp+slc+win)", "win": "window only", "dense": "dense"}
COLORS = {"nsa": "tab:blue", "win": "tab:orange", "dense": "tab:green"}
PARITY_TOLERANCE = 0.02      # nats: NSA's held-out loss may exceed dense by at most this
RETRIEVAL_TARGET = 0.90      # NSA accuracy wanted at distances > 4w


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
