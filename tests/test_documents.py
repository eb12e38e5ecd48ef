"""``data.packing: documents`` through training: each document of a packed row is its own
sequence, so the step's loss is the loss of every document run alone (tiny NSA model, CPU)."""
from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from nsa_jax.config import config_from_dict
from nsa_jax.data import build_loader


def docs_cfg(tmp_path, accum=1, attention="dense", **train):
    rng = np.random.default_rng(0)
    path = tmp_path / "docs.jsonl"
    if not path.exists():          # short documents: several per 32-token row
        path.write_text("".join(json.dumps({"text": "".join(rng.choice(list("abcdefgh"),
                                                                        int(n)))}) + "\n"
                                for n in rng.integers(2, 24, size=40)))
    return config_from_dict({
        "model": {"vocab_size": 256, "dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_groups": 1,
                  "head_dim": 16, "mlp_hidden": 64, "attention": attention},
        "nsa": {"block_l": 8, "stride_d": 4, "sel_block": 8, "n_sel": 3, "window": 8},
        "data": {"source": "text", "path": str(path), "tokenizer": "byte", "seq_len": 32,
                 "eval_fraction": 0.0, "packing": "documents", "prefetch": 0},
        "train": {"batch_size": 4, "grad_accum": accum, "warmup_steps": 1, **train}})


def test_documents_step_loss_is_each_documents_loss_alone(tmp_path):
    from nsa_jax.model import lm_loss
    from nsa_jax.train.optim import make_optimizer
    from nsa_jax.train.state import ModelSpec, init_state
    from nsa_jax.train.step import make_eval_step, make_train_step

    cfg = docs_cfg(tmp_path)
    with build_loader(cfg, batch_size=4) as ld:
        b = next(ld)
    spec = ModelSpec(cfg.model, cfg.nsa, 0)
    params = spec.init_params()
    model = spec.model(params)
    # every document alone at the start of its own row (causal: what follows it in the row
    # changes nothing), its own targets weighted: one call gives the mean over all documents
    alone, mask = [], []
    for row, seg in zip(b.tokens, b.segment_ids):
        for k in np.unique(seg):
            doc = row[seg == k]
            alone.append(np.pad(doc, (0, len(row) - len(doc)), constant_values=7))
            mask.append(np.arange(len(row) - 1) < len(doc) - 1)
    alone, mask = np.stack(alone), np.stack(mask).astype(np.float32)
    count = int(mask.sum())
    loss = jax.jit(lm_loss)
    want = float(loss(model, jnp.asarray(alone), jnp.asarray(mask)))
    assert count < b.tokens.size - 4 * 3 and len(alone) > 8   # several documents per row
    got = float(jax.jit(make_eval_step(spec, 1, data=cfg.data))(params, b))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert abs(float(loss(model, jnp.asarray(b.tokens))) - want) > 1e-3   # concat differs
    # two micro-batches count different numbers of targets: weighted by them, the same mean
    c2 = docs_cfg(tmp_path, accum=2)
    halves = [np.sum(np.diff(b.segment_ids[a::2], axis=1) == 0) for a in range(2)]
    assert halves[0] != halves[1]
    np.testing.assert_allclose(float(jax.jit(make_eval_step(spec, 2, data=c2.data))(params, b)),
                               want, rtol=1e-5)
    tx = make_optimizer(c2.train)
    _, stats = jax.jit(make_train_step(spec, c2.train, tx, data=c2.data))(
        init_state(spec, tx, 0), b)
    np.testing.assert_allclose(float(stats["loss"]), want, rtol=1e-5)


def test_documents_train_loop_runs_with_eval(tmp_path):
    """The trainer compiles its step for the batch the loader yields (segment ids included)."""
    from nsa_jax.train.loop import train
    from nsa_jax.train.metrics import read_metrics

    cfg = docs_cfg(tmp_path, accum=2, steps=2, log_every=1, eval_every=2, eval_batches=1)
    cfg = config_from_dict({**cfg.to_dict(), "run": {"dir": str(tmp_path / "run")},
                            "data": {**cfg.to_dict()["data"], "eval_fraction": 0.2}})
    summary = train(cfg)
    losses = [e["loss"] for e in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert math.isfinite(summary["eval_loss"])
