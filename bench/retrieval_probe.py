"""Retrieval learning probe: train one small model and watch *why* it does or does not retrieve.

A diagnostic twin of ``python -m nsa_jax.train`` for the retrieval study (issue 8; sweeps in
bench/NOTES.md, "Retrieval study"): the same config, model, optimizer, loss and data, in one plain
loop, and every ``--eval-every`` steps one JSON line with

* ``eval_ce`` / ``acc`` / ``far_acc``: held-out answer loss, accuracy, accuracy beyond 4w
  (4 batches of 64 held-out rows);
* ``gates``: per layer, the mean gate of each branch (cmp, slc, win) at the answer positions;
* ``recall_far``: per layer, the share of queries beyond 4w whose stored value's selection block is
  among the blocks NSA selects at the answer position (shared by the heads of a KV group); with
  ``retrieval.value_repeat`` > 1 the block of the needle's *first* value token.

Runs on any backend; at seq 256 the whole probe takes minutes on a GPU (a few runs side by side:
``bench/retrieval_sweeps.sh``) and ~0.75 s/step on 2 CPU cores::

    python bench/retrieval_probe.py NAME [--config-scale] [KEY=VALUE ...]

Without ``--config-scale`` the overrides come after ``bench/quality.py``'s ``CPU_SCALE`` (seq 256,
2 layers, dim 64, l=8, d=4, l'=16, n=4, w=16). Writes ``<--out>/NAME.json`` (the list of lines).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

EVAL_ROWS, EVAL_BATCH = 256, 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--config-scale", action="store_true",
                    help="configs/quality_retrieval.yaml as is (8k), not CPU_SCALE")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--out", default="runs/retrieval_probe")
    args = ap.parse_intermixed_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import quality
    from nsa_jax.config import load_config
    from nsa_jax.data.loader import build_loader
    from nsa_jax.data.retrieval import RetrievalLayout
    from nsa_jax.data.retrieval_eval import answer_info
    from nsa_jax.nsa.reference import select_blocks
    from nsa_jax.train.optim import lr_at, make_optimizer
    from nsa_jax.train.state import ModelSpec
    from nsa_jax.train.step import loss_and_grads

    cfg = load_config(ROOT / quality.CONFIGS["retrieval"],
                      ([] if args.config_scale else quality.CPU_SCALE) + args.overrides)
    nsa = cfg.model.attention == "nsa"
    spec = ModelSpec(cfg.model, cfg.nsa, cfg.train.seed, cfg.exec)
    params = jax.jit(spec.init_params)()
    tx = make_optimizer(cfg.train)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, batch, lr):
        loss, g = loss_and_grads(spec, params, batch, 1)  # batch.loss_mask: the answers
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, jax.tree.map(lambda u: lr * u, upd)), opt, loss

    @jax.jit
    def probe(params, toks):
        model = spec.model(params)
        inp = toks[:, :-1]
        pos = jnp.arange(inp.shape[1])
        x = model.embed(inp)
        gates, sels = [], []
        for blk in model.blocks:
            if nsa:
                a = blk.attn
                q, k_c, v_c, _, _, _, _, g = a.project_raw(blk.norm1(x), pos)
                gates.append(g)
                sels.append(select_blocks(q, a.compress_kv(k_c, v_c)[0], cfg.nsa))
            x = blk(x, pos)[0]
        return model.head_logits(model.norm(x)).astype(jnp.float32), gates, sels

    layout = RetrievalLayout.from_config(cfg)
    with build_loader(cfg, "eval", EVAL_BATCH) as ev:
        evals = [next(ev).tokens for _ in range(EVAL_ROWS // EVAL_BATCH)]
    infos = [answer_info(b, layout) for b in evals]
    far_from = 4 * cfg.nsa.window
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines, losses, t0 = [], [], time.time()
    with build_loader(cfg, "train", cfg.train.batch_size) as tr:
        for s in range(1, cfg.train.steps + 1):
            params, opt, loss = step(params, opt, next(tr), lr_at(s - 1, cfg.train))
            losses.append(float(loss))
            if s % args.eval_every and s != cfg.train.steps:
                continue
            ce, corr_all, far_all, gsum, rec = [], [], [], [], []
            for b, info in zip(evals, infos):
                logits, gates, sels = probe(params, jnp.asarray(b))
                rows = np.arange(b.shape[0])[:, None]
                p = info.positions - 1                        # the position predicting each answer
                lg = np.asarray(logits)[rows, p]              # [B, Q, V]
                m = lg.max(-1, keepdims=True)
                lse = np.log(np.exp(lg - m).sum(-1)) + m[..., 0]
                ce.append(lse - np.take_along_axis(lg, info.answers[..., None], -1)[..., 0])
                corr = lg.argmax(-1) == info.answers
                far = info.distances > far_from
                corr_all.append(corr.ravel())
                far_all.append(corr[far])
                if nsa:
                    gsum.append([np.asarray(g, np.float32)[rows, p].mean((0, 1, 2)) for g in gates])
                    vblk = (p - info.distances + 1) // cfg.nsa.sel_block   # the stored value's block
                    rec.append([(np.asarray(sl)[rows, p] == vblk[..., None, None]).any(-1)[far].mean()
                                for sl in sels])
            rec_d = {"step": s, "train": float(np.mean(losses[-args.eval_every:])),
                     "eval_ce": float(np.concatenate([c.ravel() for c in ce]).mean()),
                     "acc": float(np.concatenate(corr_all).mean()),
                     "far_acc": float(np.concatenate(far_all).mean()), "t": round(time.time() - t0)}
            if nsa:
                rec_d["gates"] = np.round(np.mean(gsum, 0), 3).tolist()
                rec_d["recall_far"] = np.round(np.mean(rec, 0), 3).tolist()
            print(json.dumps(rec_d), flush=True)
            lines.append(rec_d)
            (out / f"{args.name}.json").write_text(json.dumps(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
