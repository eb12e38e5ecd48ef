"""Long-range retrieval source (nsa_jax/data/retrieval.py) and the quality bench's evaluation."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from nsa_jax.config import ConfigError, config_from_dict
from nsa_jax.data import DataError, build_loader
from nsa_jax.data.retrieval import PAIR, QUERY, RetrievalLayout
from nsa_jax.data.retrieval_eval import (accuracy_by_distance, answer_info, distance_edges,
                                         evaluate_retrieval)

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"seq_len": 256, "retrieval_pairs": 10, "retrieval_queries": 6, "retrieval_keys": 32,
         "retrieval_values": 16}


def make_cfg(vocab=128, seed=0, **data):
    """``retrieval_X=...`` sets ``data.retrieval.X``."""
    data = {**SMALL, **data}
    retr = {k.removeprefix("retrieval_"): data.pop(k) for k in list(data)
            if k.startswith("retrieval_")}
    return config_from_dict({"model": {"vocab_size": vocab}, "train": {"seed": seed},
                             "data": {"source": "retrieval", **data, "retrieval": retr}})


def batches(cfg, n, batch_size=4, split="train", **kw):
    with build_loader(cfg, split=split, batch_size=batch_size, **kw) as loader:
        return [next(loader).tokens for _ in range(n)]


def load_bench(part: str | None = None):
    """bench/quality.py, or its sibling ``quality_<part>.py`` (which quality.py puts on sys.path)."""
    spec = importlib.util.spec_from_file_location("quality_bench", ROOT / "bench" / "quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while defined
    spec.loader.exec_module(mod)
    return mod if part is None else importlib.import_module(f"quality_{part}")


# ---- layout -----------------------------------------------------------------------------------
def test_layout_of_every_row():
    cfg = make_cfg()
    lay = RetrievalLayout.from_config(cfg)
    K, V, P, Q = 32, 16, 10, 6
    assert (lay.key0, lay.value0, lay.filler0, lay.filler) == (2, 2 + K, 2 + K + V, 128 - 2 - K - V)
    C = lay.context_len
    assert C == 257 - 3 * Q
    rows = np.concatenate(batches(cfg, 3))
    assert rows.shape == (12, 257) and rows.dtype == np.int32
    for row in rows:
        starts = np.flatnonzero(row[:C] == PAIR)
        assert len(starts) == P and np.all(np.diff(starts) >= 3) and starts[-1] + 3 <= C
        keys, vals = row[starts + 1], row[starts + 2]
        assert np.all((keys >= 2) & (keys < 2 + K)) and len(set(keys)) == P    # distinct keys
        assert np.all((vals >= 2 + K) & (vals < 2 + K + V))
        filler = np.ones(C, bool)
        filler[np.concatenate([starts, starts + 1, starts + 2])] = False
        assert np.all((row[:C][filler] >= lay.filler0) & (row[:C][filler] < 128))
        q = row[C:].reshape(Q, 3)
        assert np.all(q[:, 0] == QUERY)
        assert len(set(q[:, 1])) == Q                       # each query asks a different pair
        stored = dict(zip(keys, vals))
        assert all(stored[k] == v for k, v in q[:, 1:])     # the answer is the stored value
    np.testing.assert_array_equal(lay.answer_positions(), C + 3 * np.arange(Q) + 2)
    mask = lay.answer_loss_mask()                           # over targets rows[:, 1:]
    assert mask.shape == (256,) and mask.sum() == Q
    np.testing.assert_array_equal(rows[:, 1:][:, mask == 1], rows[:, lay.answer_positions()])


def test_cycle_filler_is_one_fixed_cycle_across_pairs():
    cfg = make_cfg(retrieval_filler_mode="cycle")
    lay = RetrievalLayout.from_config(cfg)
    cycle = lay.filler_cycle(0)
    assert sorted(cycle) == list(range(lay.filler0, 128))        # every filler id once
    where = np.empty(128, np.int64)
    where[cycle] = np.arange(lay.filler)
    C = lay.context_len
    rows = np.concatenate(batches(cfg, 2))
    offsets = set()
    for row in rows:
        i = np.flatnonzero(row[:C] >= lay.filler0)                 # filler positions
        assert len(i) == C - 3 * lay.pairs
        o = (where[row[i]] - i) % lay.filler                       # same offset everywhere
        assert len(set(o)) == 1
        offsets.add(int(o[0]))
    assert len(offsets) > 1                                        # rows start at random places
    assert not np.array_equal(lay.filler_cycle(1), cycle)
    with pytest.raises(ConfigError, match="data.retrieval.filler_mode"):
        make_cfg(retrieval_filler_mode="zigzag")


def test_deterministic_by_seed_and_split():
    a = np.concatenate(batches(make_cfg(), 2))
    b = np.concatenate(batches(make_cfg(), 2))
    np.testing.assert_array_equal(a, b)
    c = np.concatenate(batches(make_cfg(seed=1), 2))
    e = np.concatenate(batches(make_cfg(), 2, split="eval"))
    for other in (c, e):
        assert not any(np.array_equal(x, y) for x in a for y in other)


def test_answer_info_matches_generation_and_distances_are_in_range():
    cfg = make_cfg(seq_len=512, retrieval_min_distance=40, retrieval_max_distance=300)
    lay = RetrievalLayout.from_config(cfg)
    from nsa_jax.data.retrieval import build_retrieval_source

    src = build_retrieval_source(cfg, "train", 0, 1, None)
    rows, dists = zip(*(src.row(g) for g in range(40)))
    info = answer_info(np.stack(rows), lay)
    np.testing.assert_array_equal(info.distances, np.stack(dists))
    np.testing.assert_array_equal(info.answers, np.stack(rows)[:, lay.answer_positions()])
    assert info.distances.min() >= 40 and info.distances.max() <= 300
    # roughly uniform over the range: each third holds a fair share
    counts = np.histogram(info.distances, bins=[40, 127, 214, 301])[0]
    assert counts.min() > 0.2 * counts.sum()
    # and the stream's rows are the source's rows
    np.testing.assert_array_equal(np.concatenate(batches(cfg, 1, batch_size=5)), np.stack(rows[:5]))


def test_answers_placed_beyond_the_window():
    w = 32
    cfg = make_cfg(seq_len=1024, retrieval_min_distance=4 * w + 1)
    lay = RetrievalLayout.from_config(cfg)
    info = answer_info(np.concatenate(batches(cfg, 4)), lay)
    assert info.distances.min() > 4 * w
    # the stored value really lies outside a causal window of w at the query's key
    rows = np.concatenate(batches(cfg, 4))
    for b, row in enumerate(rows):
        for j, a in enumerate(info.positions[b]):
            t = a - 1                                   # predicting position
            window = row[t - w + 1:t + 1]
            k = row[t]
            hits = np.flatnonzero((window[:-2] == PAIR) & (window[1:-1] == k))
            assert len(hits) == 0


def test_resume_exact_and_processes():
    cfg = make_cfg(prefetch=2)
    with build_loader(cfg, batch_size=3) as full:
        ref = [next(full).tokens for _ in range(5)]
    with build_loader(cfg, batch_size=3) as first:
        head = [next(first).tokens for _ in range(2)]
        state = json.loads(json.dumps(first.state()))
    assert state["source"] == "retrieval" and state["seq"] == 6
    with build_loader(cfg, batch_size=3, state=state) as second:
        tail = [next(second).tokens for _ in range(3)]
    for x, y in zip(head + tail, ref):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(DataError, match="seq_len"):
        build_loader(make_cfg(seq_len=300), batch_size=3, state=state)
    p0 = batches(cfg, 1, batch_size=2, process_index=0, process_count=2)[0]
    p1 = batches(cfg, 1, batch_size=2, process_index=1, process_count=2)[0]
    both = np.concatenate(batches(cfg, 1, batch_size=4))
    np.testing.assert_array_equal(np.stack([p0[0], p1[0], p0[1], p1[1]]), both)


def test_errors_name_the_key():
    def err(match, vocab=128, **data):
        with pytest.raises(DataError, match=match):
            build_loader(make_cfg(vocab=vocab, **data), batch_size=1)

    err(r"data.retrieval.pairs: 4 < retrieval.queries=6", retrieval_pairs=4)
    err(r"data.retrieval.keys: 8 < retrieval.pairs=10", retrieval_keys=8)
    err(r"data.retrieval.filler: no ids left", vocab=50)
    err(r"data.retrieval.filler: .* = 151 > model.vocab_size=128", retrieval_filler=101)
    err(r"data.seq_len: 40 is too short", seq_len=40)
    err(r"data.retrieval.min_distance: .*no place for query 0", retrieval_min_distance=300)
    err(r"data.retrieval.max_distance: .*no place for query 3 .*\[12, 248\]",
        retrieval_max_distance=10)
    err(r"data.retrieval.queries: must be >= 1", retrieval_queries=0)
    with pytest.raises(ConfigError, match="data.source"):
        config_from_dict({"data": {"source": "retrieve"}})
    lay = RetrievalLayout.from_config(make_cfg())
    bad = np.concatenate(batches(make_cfg(), 1))
    with pytest.raises(DataError, match=r"expected \[B, 257\]"):
        answer_info(bad[:, :-1], lay)
    bad[0, lay.context_len + 3] = 5
    with pytest.raises(DataError, match="row 0 has no query marker"):
        answer_info(bad, lay)


# ---- evaluation -------------------------------------------------------------------------------
def oracle(window=None, guess_seed=0, lay=None):
    """Reads only the inputs, like a model: at query position t, looks for a value token u
    (among the last ``window`` positions if given: t-w < u <= t) whose two predecessors are
    (PAIR, queried key) -- what attention over representations that know their previous tokens
    can see -- and predicts it; guesses a random value when there is none."""
    rng = np.random.default_rng(guess_seed)

    def predict(inputs, positions):
        out = np.empty(positions.shape, np.int64)
        for b in range(inputs.shape[0]):
            row = inputs[b]
            for j, t in enumerate(positions[b]):
                u = np.arange(2 if window is None else max(2, t - window + 1), t + 1)
                hit = u[(row[u - 2] == PAIR) & (row[u - 1] == row[t])]
                out[b, j] = row[hit[0]] if len(hit) else lay.value0 + rng.integers(lay.values)
        return out

    return predict


def test_oracle_scores_100_and_window_oracle_is_at_chance_beyond_w():
    w = 24
    cfg = make_cfg(seq_len=512, retrieval_values=8)
    lay = RetrievalLayout.from_config(cfg)
    rows = batches(cfg, 12, batch_size=8, split="eval")
    full = evaluate_retrieval(oracle(lay=lay), rows, lay, w)
    assert full["overall"]["accuracy"] == 1.0 and full["queries"] == 12 * 8 * 6
    assert all(b["accuracy"] == 1.0 for b in full["bins"] if b["n"])
    assert [b["hi"] for b in full["bins"]] == [24, 48, 96, 192, 384, 768]
    assert sum(b["n"] for b in full["bins"]) == full["queries"]

    win = evaluate_retrieval(oracle(window=w, lay=lay), rows, lay, w)
    assert win["within_w"]["accuracy"] == 1.0 and win["bins"][0]["accuracy"] == 1.0
    far = win["beyond_4w"]
    sigma = np.sqrt(lay.chance * (1 - lay.chance) / far["n"])
    assert far["n"] > 300 and abs(far["accuracy"] - lay.chance) < 4 * sigma
    assert win["chance"] == 1 / 8

    rng = np.random.default_rng(1)
    rand = evaluate_retrieval(lambda x, p: lay.value0 + rng.integers(lay.values, size=p.shape),
                              rows, lay, w)
    n = rand["overall"]["n"]
    assert abs(rand["overall"]["accuracy"] - 1 / 8) < 4 * np.sqrt(1 / 8 * 7 / 8 / n)


def test_window_boundary_distance_w_is_visible_w_plus_1_is_not():
    w = 40
    cfg = make_cfg(seq_len=512, retrieval_min_distance=w, retrieval_max_distance=w + 1,
                   retrieval_values=8)
    lay = RetrievalLayout.from_config(cfg)
    rows = batches(cfg, 4, batch_size=8)
    res = evaluate_retrieval(oracle(window=w, lay=lay), rows, lay, w)
    at_w, past_w = res["bins"][0], res["bins"][1]
    assert (at_w["lo"], at_w["hi"], past_w["hi"]) == (0, w, 2 * w)
    assert at_w["n"] > 20 and past_w["n"] > 20     # a pair at w pushes the next query's to w
    assert at_w["accuracy"] == 1.0 and past_w["accuracy"] < 0.5


def test_accuracy_by_distance_hand_made():
    edges = distance_edges(10, 35)
    assert edges == [0, 10, 20, 40]
    assert distance_edges(10, 40) == [0, 10, 20, 40]
    d = np.array([1, 10, 11, 20, 21, 40])
    c = np.array([1, 1, 0, 1, 0, 0], bool)
    bins = accuracy_by_distance(c, d, edges)
    assert [(b["n"], b["correct"]) for b in bins] == [(2, 2), (2, 1), (2, 0)]
    assert [b["accuracy"] for b in bins] == [1.0, 0.5, 0.0]
    assert accuracy_by_distance(c[:0], d[:0], edges)[0]["accuracy"] is None
    with pytest.raises(ValueError, match="outside the bins"):
        accuracy_by_distance(c, d + 1, edges)


def test_model_predictor_is_argmax_of_logits_at_the_query():
    import jax.numpy as jnp
    from flax import nnx

    from nsa_jax.model import build_model

    quality_eval = load_bench("eval")
    cfg = config_from_dict({"model": {"vocab_size": 64, "dim": 32, "n_layers": 1, "n_heads": 2,
                                      "n_kv_groups": 1, "head_dim": 16, "mlp_hidden": 64,
                                      "attention": "dense"},
                            "nsa": {"block_l": 8, "stride_d": 4, "sel_block": 8, "n_sel": 2,
                                    "window": 8, "n_init": 1, "n_local": 1}})
    model = build_model(cfg.model, cfg.nsa, seed=3)
    x = np.random.default_rng(0).integers(0, 64, size=(2, 40)).astype(np.int32)
    pos = np.array([[3, 17, 39], [0, 20, 38]])
    got = quality_eval.make_predictor(model)(x, pos)
    logits = np.asarray(nnx.jit(lambda m, t: m.logits(t))(model, jnp.asarray(x)))
    want = np.take_along_axis(logits.argmax(-1), pos, axis=1)
    np.testing.assert_array_equal(got, want)


# ---- bench helpers ----------------------------------------------------------------------------
def test_bench_checks_merge_and_staging(tmp_path):
    bench = load_bench()
    acc = lambda a, n=1000: {"n": n, "correct": int(a * n), "accuracy": a}
    variants = {"nsa": {"beyond_4w": acc(0.95), "chance": 1 / 512},
                "win": {"beyond_4w": acc(0.004), "chance": 1 / 512}}
    chk = bench.retrieval_checks(variants)
    assert chk["nsa_beyond_4w_ge_0.9"] and chk["win_beyond_4w_at_chance"]
    variants["win"]["beyond_4w"] = acc(0.2)
    assert not bench.retrieval_checks(variants)["win_beyond_4w_at_chance"]

    curve = lambda *ls: [{"step": 10 * (i + 1), "eval_loss": l} for i, l in enumerate(ls)]
    p = bench.parity_checks({"nsa": {"eval_curve": curve(5.0, 4.0, 3.03)},
                             "dense": {"eval_curve": curve(5.1, 4.0, 3.0)}})
    assert p["step"] == 30 and p["nsa_minus_dense"] == pytest.approx(0.03)
    assert p["within_0.02"] is False

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"study": "retrieval", "variants": {"win": {"old": 1}}}))
    merged = bench.merge_results(path, "retrieval", False, "h200", {"nsa": {"new": 1}})
    assert merged["variants"] == {"win": {"old": 1}, "nsa": {"new": 1}}
    with pytest.raises(bench.BenchError, match="holds study 'retrieval'"):
        bench.merge_results(path, "parity", False, "h200", {})

    src = tmp_path / "texts"
    src.mkdir()
    (src / "a.txt").write_bytes("".join(f"a{i}\r\n" for i in range(10)).encode())
    (src / "b.txt").write_bytes("caf\xe9\n".encode("latin-1") * 4)
    (src / "README.txt").write_text("not a text")
    out = tmp_path / "staged"
    load_bench("runs").stage_texts([str(src)], out, chunks=2)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["000_a.txt", "000_b.txt", "001_a.txt", "001_b.txt"]
    assert (out / "001_a.txt").read_text() == "".join(f"a{i}\n" for i in range(5, 10))
    assert (out / "000_b.txt").read_text(encoding="utf-8") == "café\n" * 2


# ---- training on the answers only (data.retrieval.loss) -------------------------------------
def test_answers_loss_is_lm_loss_with_the_answer_mask_in_train_and_eval_steps():
    import jax
    import jax.numpy as jnp

    from nsa_jax.model import lm_loss
    from nsa_jax.train.optim import make_optimizer
    from nsa_jax.train.state import ModelSpec, init_state
    from nsa_jax.train.step import make_eval_step, make_train_step

    def cfg_for(loss, accum=1):
        return config_from_dict({
            "model": {"vocab_size": 96, "dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_groups": 1,
                      "head_dim": 16, "mlp_hidden": 64, "attention": "dense"},
            "train": {"batch_size": 4, "grad_accum": accum},
            "data": {"source": "retrieval", "seq_len": 64, "retrieval": {
                "pairs": 4, "queries": 3, "keys": 16, "values": 16, "loss": loss}}})

    cfg = cfg_for("answers")
    lay = RetrievalLayout.from_config(cfg)
    with build_loader(cfg, batch_size=4) as ld:           # the source yields the answers' mask
        b = next(ld)
    np.testing.assert_array_equal(b.loss_mask, np.broadcast_to(lay.answer_loss_mask(), (4, 64)))
    with build_loader(cfg_for("all"), batch_size=4) as ld:
        b_all = next(ld)
    assert b_all.loss_mask is None and b.segment_ids is None
    np.testing.assert_array_equal(b_all.tokens, b.tokens)
    spec = ModelSpec(cfg.model, cfg.nsa, 0)
    params = spec.init_params()
    batch = jnp.asarray(b.tokens)
    model = spec.model(params)
    mask = jnp.broadcast_to(jnp.asarray(lay.answer_loss_mask()), (4, 64))
    want = float(lm_loss(model, batch, mask))
    full = float(lm_loss(model, batch))
    assert abs(want - full) > 1e-3                      # the mask changes the loss
    # by hand: mean cross-entropy at the 3 answer targets of every row
    logits = np.asarray(model.logits(batch[:, :-1]), np.float64)
    pos = lay.answer_positions() - 1
    lp = logits[:, pos] - np.log(np.exp(logits[:, pos]).sum(-1, keepdims=True))
    ans = np.asarray(batch)[:, pos + 1]
    np.testing.assert_allclose(want, -np.take_along_axis(lp, ans[..., None], -1).mean(),
                               rtol=1e-5)
    got = float(jax.jit(make_eval_step(spec, 1, data=cfg.data))(params, b))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    c = cfg_for("answers", accum=2)    # same number of answers in every micro-batch: same mean
    tx = make_optimizer(c.train)
    state = init_state(spec, tx, 0)
    _, stats = jax.jit(make_train_step(spec, c.train, tx, data=c.data))(state, b)
    np.testing.assert_allclose(float(stats["loss"]), want, rtol=1e-5)
    plain = float(jax.jit(make_eval_step(spec, 1, data=cfg_for("all").data))(params, b_all))
    np.testing.assert_allclose(plain, full, rtol=1e-5)
    with pytest.raises(ValueError, match="batch.loss_mask: the data config"):
        make_eval_step(spec, 1, data=cfg.data)(params, b_all)   # a batch without the mask


def test_retrieval_loss_and_distance_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"data.retrieval.loss: answers needs "
                                          r"data.source=retrieval.*data.source=synthetic"):
        config_from_dict({"data": {"retrieval_loss": "answers"}})
    with pytest.raises(ConfigError, match=r"data.retrieval.loss: must be one of"):
        make_cfg(retrieval_loss="queries")
    with pytest.raises(ConfigError, match=r"data.retrieval.distance: must be one of"):
        make_cfg(retrieval_distance="normal")
    assert make_cfg(retrieval_loss="answers").data.retrieval.loss == "answers"


def test_log_distance_is_log_uniform_within_the_range():
    def first_query_distances(dist, **kw):
        cfg = make_cfg(seq_len=1024, retrieval_pairs=4, retrieval_queries=2, retrieval_values=8,
                       retrieval_distance=dist, **kw)
        lay = RetrievalLayout.from_config(cfg)
        info = answer_info(np.concatenate(batches(cfg, 25, batch_size=16)), lay)
        return info.distances[:, 0], lay

    d, lay = first_query_distances("log")
    lo, hi = lay.distance_range(0)
    assert d.min() >= lo and d.max() <= hi
    # log-uniform: each quarter of [log lo, log hi] holds about a quarter of the draws
    q = np.histogram(np.log(d), bins=np.linspace(np.log(lo), np.log(hi + 1), 5))[0] / len(d)
    assert np.all(np.abs(q - 0.25) < 0.08), q
    u, _ = first_query_distances("uniform")
    short = np.sqrt(lo * hi)                  # the geometric middle of the range
    assert (d <= short).mean() > 0.4 and (u <= short).mean() < 0.15
    d2, _ = first_query_distances("log", retrieval_min_distance=100, retrieval_max_distance=400)
    assert d2.min() >= 100 and d2.max() <= 400 and (d2 <= 200).mean() > 0.35


# ---- bench launcher: concurrent runs, time budget ------------------------------------------
_CHILD = """
import os, signal, sys, time
out = sys.argv[1]
mode = sys.argv[2]
def stop(*_):
    open(out, "a").write("sigterm\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else stop)
open(out, "a").write("mem=" + os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "-") + "\\n")
if mode == "fail":
    sys.exit(3)
time.sleep(60)
"""


def test_run_jobs_parallel_budget_stops_with_sigterm_then_kill(tmp_path):
    import time

    bench = load_bench()

    def job(name, mode):
        d = tmp_path / name
        d.mkdir()
        return bench.Job("retrieval", name, d, [sys.executable, "-c", _CHILD, str(d / "out"), mode],
                         log_path=tmp_path / f"{name}.log")

    jobs = [job("term", "sleep"), job("fail", "fail"), job("stubborn", "ignore")]
    bench.set_memory_shares(jobs, None)
    t0 = time.monotonic()
    bench.run_jobs(jobs, parallel=True, budget_s=2.0, grace_s=1.0, status_every_s=0.5)
    wall = time.monotonic() - t0
    term, fail, stubborn = jobs
    assert 2.0 <= wall < 20
    assert (term.rc, term.stopped, term.failed) == (0, "time budget", False)
    assert (tmp_path / "term" / "out").read_text() == "mem=0.300\nsigterm\n"
    assert fail.rc == 3 and fail.failed and not fail.stopped
    assert stubborn.rc == -9 and stubborn.stopped and not stubborn.failed   # SIGKILL after grace
    rec = json.loads((tmp_path / "term" / "bench_train.json").read_text())
    assert rec[0]["stopped"] == "time budget" and rec[0]["exit"] == 0


def test_run_jobs_sequential_budget_skips_runs_not_started(tmp_path):
    bench = load_bench()
    jobs = [bench.Job("parity", v, tmp_path, [sys.executable, "-c", _CHILD, str(tmp_path / v),
                                               "sleep"]) for v in ("nsa", "dense")]
    bench.run_jobs(jobs, parallel=False, budget_s=1.5, grace_s=5.0)
    assert (jobs[0].rc, jobs[0].stopped) == (0, "time budget")
    assert jobs[1].rc is None and jobs[1].stopped == "time budget: not started"
    assert not (tmp_path / "dense").exists()
    assert (tmp_path / "nsa").read_text() == "mem=-\nsigterm\n"   # only --parallel sets it


def test_repeat_filler_is_periodic_and_pair_marked_queries_repeat_the_stored_context():
    cfg = make_cfg(retrieval_filler_mode="repeat", retrieval_filler_period_min=5,
                   retrieval_filler_period_max=12, retrieval_query_marker="pair")
    lay = RetrievalLayout.from_config(cfg)
    C = lay.context_len
    rows = np.concatenate(batches(cfg, 4))
    info = answer_info(rows, lay)                       # validates pairs, answers, markers
    periods, used = set(), set()
    for b, row in enumerate(rows):
        ctx = row[:C]
        pair_pos = np.flatnonzero(ctx == PAIR)
        keys, vals = ctx[pair_pos + 1], ctx[pair_pos + 2]
        filler = np.ones(C, bool)
        filler[np.concatenate([pair_pos, pair_pos + 1, pair_pos + 2])] = False
        # the smallest p with ctx[i] == ctx[i + p] wherever both are filler
        p = next(p for p in range(5, 13) if all(ctx[i] == ctx[i + p] for i in range(C - p)
                                                if filler[i] and filler[i + p]))
        periods.add(p)
        seg = {int(ctx[i]) for i in range(C) if filler[i]}
        assert len(seg) == p                                    # p distinct ids
        assert not seg & (set(keys.tolist()) | set(vals.tolist()) | {PAIR, QUERY})
        used |= seg
        q = row[C:].reshape(-1, 3)
        assert np.all(q[:, 0] == PAIR)                          # the stored (PAIR, key) again
        for (m, k, v), d, a in zip(q, info.distances[b], info.positions[b]):
            s = a - 1 - d                                       # the stored key's position
            assert (row[s - 1], row[s], row[s + 1]) == (PAIR, k, v)
    assert len(periods) > 2
    assert {t for t in used if t < lay.filler0}          # other rows' key/value ids fill too
    with pytest.raises(DataError, match="row 0 has no query marker"):
        answer_info(rows, RetrievalLayout.from_config(make_cfg()))   # QUERY expected there


def test_repeat_filler_errors_name_the_key():
    def err(match, **data):
        with pytest.raises(DataError, match=match):
            build_loader(make_cfg(retrieval_filler_mode="repeat", **data), batch_size=1)

    err(r"data.retrieval.filler_period_min: must be >= 2", retrieval_filler_period_max=8)
    err(r"data.retrieval.filler_period_max: 4 < retrieval.filler_period_min=6",
        retrieval_filler_period_min=6, retrieval_filler_period_max=4)
    err(r"data.retrieval.filler_period_max: 240 > 106 ", retrieval_filler_period_min=6,
        retrieval_filler_period_max=240, seq_len=512)
    with pytest.raises(ConfigError, match="data.retrieval.query_marker: must be one of"):
        make_cfg(retrieval_query_marker="key")
    bench = load_bench()
    args = bench.build_parser().parse_args(["parity", "--cpu-scale"])
    with pytest.raises(bench.BenchError, match="--cpu-scale: only for the retrieval study"):
        bench.plan_study("parity", args)


# ---- copy filler -------------------------------------------------------------------------------
COPY = {"retrieval_filler_mode": "copy", "retrieval_filler_period_min": 8,
        "retrieval_filler_period_max": 32, "retrieval_query_marker": "pair"}


def copy_rows(n, seed=0, split="train", **data):
    """``n`` rows of a copy-filler layout with their spans, straight from the source."""
    from nsa_jax.data.retrieval import RetrievalSource

    cfg = make_cfg(vocab=512, seed=seed, **{**COPY, **data})
    lay = RetrievalLayout.from_config(cfg)
    src = RetrievalSource(lay, seed, split, 0, 1)
    out = [lay.generate_with_spans(np.random.default_rng([seed, 0x2E7A, src.split_id, g]))
           for g in range(n)]
    for g, (row, dist, _) in enumerate(out):       # the source's rows are these rows
        r, d = src.row(g)
        np.testing.assert_array_equal(r, row)
        np.testing.assert_array_equal(d, dist)
    return cfg, lay, out


def test_copy_filler_spans_are_copies_of_earlier_context():
    cfg, lay, out = copy_rows(6, seq_len=4096)
    C = lay.context_len
    rows = np.stack([r for r, _, _ in out])
    answer_info(rows, lay)                              # pairs, queries and answers intact
    for row, _, spans in out:
        s, L, D = spans.T
        assert len(spans) > 50 and np.all(np.diff(s) >= L[:-1])        # in order, disjoint
        assert np.all((L >= 8) & (L <= 32)) and np.all(s + L <= C)
        assert np.all((D >= L) & (D <= s))                             # source before target
        pair = np.zeros(C, bool)                                       # pair-overwritten
        starts = np.flatnonzero(row[:C] == PAIR)
        assert len(starts) == lay.pairs
        pair[np.concatenate([starts, starts + 1, starts + 2])] = True
        checked = 0
        for a, n, d in spans:
            ok = ~pair[a:a + n] & ~pair[a - d:a - d + n]
            np.testing.assert_array_equal(row[a:a + n][ok], row[a - d:a - d + n][ok])
            checked += ok.sum()
        assert checked > 0.4 * C
        # this row's keys and values occur only in its pairs and queries
        keys, vals = row[starts + 1], row[starts + 2]
        own = np.isin(row, np.concatenate([keys, vals]))
        where = np.flatnonzero(own)
        expect = np.concatenate([starts + 1, starts + 2, C + 3 * np.arange(lay.queries) + 1,
                                 C + 3 * np.arange(lay.queries) + 2])
        np.testing.assert_array_equal(where, np.sort(expect))
        assert not np.isin(row[:C][~pair], [PAIR, QUERY]).any()
        # the filler pool is repeat's: other rows' key and value ids fill too
        other = row[:C][~pair]
        assert ((other >= lay.key0) & (other < lay.filler0)).any()


def test_copy_filler_share_and_distances():
    for frac in (0.5, 0.9):
        _, lay, out = copy_rows(4, seq_len=8192, retrieval_pairs=16, retrieval_queries=8,
                                retrieval_copy_fraction=frac)
        C = lay.context_len
        covered, repeated = 0, 0
        for row, _, spans in out:
            covered += spans[:, 1].sum()
            # measured from the tokens alone: positions whose 8-gram ending there occurred
            # earlier (a chance repeat of 8 ids drawn from ~400 is negligible)
            grams = np.lib.stride_tricks.sliding_window_view(row[:C], 8)
            _, first = np.unique(grams, axis=0, return_index=True)
            seen_before = np.ones(len(grams), bool)
            seen_before[first] = False
            repeated += seen_before.sum() + 7 * len(spans)   # a copy's first 7 end no 8-gram
        share = covered / (4 * C)
        assert abs(share - frac) < 0.06, (frac, share)
        assert abs(repeated / (4 * C) - share) < 0.02, (repeated / (4 * C), share)
    # distances: uniform over [L, s] vs log-uniform (many short, a share far)
    D = {}
    for dist in ("uniform", "log"):
        _, lay, out = copy_rows(4, seq_len=8192, retrieval_pairs=16, retrieval_queries=8,
                                retrieval_distance=dist)
        spans = np.concatenate([sp for _, _, sp in out])
        s, L, d = spans.T
        assert np.all((d >= L) & (d <= s))
        D[dist] = (d - L) / np.maximum(s - L, 1)        # position of D within [L, s]
    assert 0.4 < np.median(D["uniform"]) < 0.6
    assert np.median(D["log"]) < 0.1 and (D["log"] > 0.5).mean() > 0.05


def test_copy_filler_deterministic_per_seed_split_row():
    _, _, a = copy_rows(3)
    _, _, b = copy_rows(3)
    _, _, c = copy_rows(3, seed=1)
    _, _, e = copy_rows(3, split="eval")
    for (ra, _, sa), (rb, _, sb) in zip(a, b):
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_array_equal(sa, sb)
    rows_a = [r for r, _, _ in a]
    assert not any(np.array_equal(x, y) for x in rows_a for y in rows_a if x is not y)
    for other in (c, e):
        assert not any(np.array_equal(x, r) for x in rows_a for r, _, _ in other)
    # the loader streams the same rows
    cfg = make_cfg(vocab=512, **COPY)
    np.testing.assert_array_equal(np.concatenate(batches(cfg, 1, batch_size=3)),
                                  np.stack(rows_a))


def test_copy_filler_errors_name_the_key():
    def err(match, **data):
        with pytest.raises(DataError, match=match):
            build_loader(make_cfg(vocab=512, **{**COPY, **data}), batch_size=1)

    C = 257 - 3 * 6
    err(r"^data.retrieval.copy_fraction: must be in \(0, 1\] with filler_mode copy, got 0.0$",
        retrieval_copy_fraction=0.0)
    err(r"^data.retrieval.copy_fraction: must be in \(0, 1\] with filler_mode copy, got 1.5$",
        retrieval_copy_fraction=1.5)
    err(rf"^data.retrieval.filler_period_max: {C // 2 + 1} > {C // 2} \(with filler_mode copy",
        retrieval_filler_period_max=C // 2 + 1)
    err(r"^data.retrieval.filler_period_min: must be >= 2 with filler_mode copy, got 0$",
        retrieval_filler_period_min=0)
    err(r"^data.retrieval.filler_period_max: 4 < retrieval.filler_period_min=8$",
        retrieval_filler_period_max=4)
    RetrievalLayout.from_config(make_cfg(vocab=512, **{**COPY, "retrieval_filler_period_max":
                                                       C // 2, "retrieval_copy_fraction": 1.0}))
    # copy_fraction is only checked for copy filler (its default is valid, not used elsewhere)
    RetrievalLayout.from_config(make_cfg(retrieval_copy_fraction=0.0))


def test_copy_filler_skip_bigram_groups():
    """filler_groups G: every fresh filler id (outside copies, pairs and the two ids that
    restart a chain every 64 tokens) is in the group (id mod G) of the id two back, and the ids
    of a group are used about evenly."""
    from nsa_jax.data.retrieval import RetrievalSource

    cfg = make_cfg(vocab=512, **{**COPY, "seq_len": 4096, "retrieval_filler_groups": 8})
    lay = RetrievalLayout.from_config(cfg)
    src = RetrievalSource(lay, 0, "train", 0, 1)
    C = lay.context_len
    fresh_ids = []
    for g in range(3):
        row, _, spans = lay.generate_with_spans(np.random.default_rng([0, 0x2E7A, 1, g]))
        np.testing.assert_array_equal(row, src.row(g)[0])
        fresh = np.ones(C, bool)
        for s, L, _ in spans:
            fresh[s:s + L] = False
        fresh[np.flatnonzero(row[:C] == PAIR)[:, None] + np.arange(3)] = False
        assert np.all((row[:C][fresh] >= lay.filler0) &
                      (row[:C][fresh] < lay.filler0 + lay.filler))
        t = np.flatnonzero(fresh[2:] & fresh[:-2]) + 2
        t = t[t % 64 >= 2]
        assert len(t) > 0.3 * C
        f = row[t] - lay.filler0
        np.testing.assert_array_equal(f % 8, (row[t - 2] - lay.filler0) % 8)
        fresh_ids.append(f)
    counts = np.bincount(np.concatenate(fresh_ids), minlength=lay.filler)
    assert counts.min() > 0 and counts.max() < 4 * counts.mean()     # every id, about evenly
    with pytest.raises(DataError, match=r"^data.retrieval.filler_groups: must be in \[0, "):
        build_loader(make_cfg(vocab=512, **{**COPY, "retrieval_filler_groups": -1}),
                     batch_size=1)


def test_values_per_key_one_hop_layout():
    """values_per_key n: the value of key i is one of value ids [i*n, (i+1)*n) (chance 1/n), in
    pairs and answers; with copy filler no value of this row's keys appears as filler."""
    for mode in ("random", "copy"):
        extra = COPY if mode == "copy" else {}
        cfg = make_cfg(vocab=512, **{**extra, "retrieval_keys": 32, "retrieval_values": 256,
                                     "retrieval_values_per_key": 8})
        lay = RetrievalLayout.from_config(cfg)
        assert lay.chance == 1 / 8
        rows = np.concatenate(batches(cfg, 2, batch_size=4))
        info = answer_info(rows, lay)                 # answers are the stored values
        C = lay.context_len
        for row, ans in zip(rows, info.answers):
            keys = row[C + 1::3] - lay.key0
            np.testing.assert_array_equal((ans - lay.value0) // 8, keys)
            own = lay.value0 + keys[:, None] * 8 + np.arange(8)
            starts = np.flatnonzero(row[:C] == PAIR)
            ctx = row[:C].copy()
            ctx[starts + 2] = -1                      # the stored values themselves
            assert not np.isin(ctx, own).any()
    with pytest.raises(DataError, match=r"^data.retrieval.values_per_key: must be 0 or n >= 1 "
                                        r"with retrieval.values >= retrieval.keys \* n"):
        build_loader(make_cfg(vocab=512, retrieval_keys=32, retrieval_values=64,
                              retrieval_values_per_key=8), batch_size=1)


def test_value_repeat_writes_needles():
    """value_repeat r: every stored pair is PAIR, key, value x r; pairs never overlap and end
    inside the context; queries stay (marker, key, value); distances are to the pair's key."""
    r = 5
    cfg = make_cfg(vocab=512, retrieval_keys=32, retrieval_values=256, retrieval_values_per_key=8,
                   retrieval_value_repeat=r)
    lay = RetrievalLayout.from_config(cfg)
    assert lay.pair_len == 2 + r
    C, Q = lay.context_len, lay.queries
    rows = np.concatenate(batches(cfg, 3, batch_size=4))
    info = answer_info(rows, lay)
    for row, ans, dist in zip(rows, info.answers, info.distances):
        starts = np.flatnonzero(row[:C] == PAIR)
        assert len(starts) == lay.pairs and np.all(np.diff(starts) >= 2 + r)
        assert starts[-1] + 2 + r <= C
        for s in starts:
            assert lay.key0 <= row[s + 1] < lay.value0
            np.testing.assert_array_equal(row[s + 2:s + 2 + r], row[s + 2])   # the needle
            assert (row[s + 2] - lay.value0) // 8 == row[s + 1] - lay.key0
        in_pair = np.zeros(C, bool)
        for s in starts:
            in_pair[s:s + 2 + r] = True
        assert np.all(row[:C][~in_pair] >= lay.filler0)   # everything else is filler
        qkey = C + 3 * np.arange(Q) + 1
        np.testing.assert_array_equal(row[qkey - 1], PAIR if lay.query_marker == "pair" else QUERY)
        where = {int(row[s + 1]): s for s in starts}
        for j in range(Q):
            s = where[int(row[qkey[j]])]
            assert dist[j] == qkey[j] - (s + 1) and ans[j] == row[s + 2]
            assert dist[j] >= 3 * j + 2 + r          # the needle ends before the queries
    with pytest.raises(DataError, match=r"^data.retrieval.value_repeat: must be >= 1, got 0"):
        build_loader(make_cfg(retrieval_value_repeat=0), batch_size=1)
    with pytest.raises(DataError, match=r"^data.seq_len: 256 is too short for 6 queries and 10 "
                                        r"pairs of 14 tokens"):
        build_loader(make_cfg(retrieval_value_repeat=12), batch_size=1)


def test_bench_override_sets_give_valid_retrieval_layouts():
    """The committed retrieval config and bench/quality.py's --smoke and --cpu-scale override sets
    (each with every variant's overrides) build a config and a layout -- checked here, not by
    a training run failing on a GPU."""
    from nsa_jax.config import load_config
    bench = load_bench()
    path = ROOT / bench.CONFIGS["retrieval"]
    for extra in ([], bench.SMOKE["retrieval"], bench.CPU_SCALE):
        for variant in bench.VARIANTS["retrieval"].values():
            cfg = load_config(path, [*variant, *extra])
            lay = RetrievalLayout.from_config(cfg)
            assert lay.value_repeat == cfg.data.retrieval.value_repeat >= 1


# ---- bench/quality.py parity report: two seeds, the spread as noise floor -------------------------
def parity_curve(*losses):
    return {"eval_curve": [{"step": 10 * (i + 1), "eval_loss": l} for i, l in enumerate(losses)]}


def test_parity_checks_with_two_seeds_report_each_seed_and_the_spread():
    bench = load_bench()
    v = {"nsa": parity_curve(5.0, 4.0, 4.2), "dense": parity_curve(5.0, 3.9, 4.1),
         "nsa_s1": parity_curve(5.0, 3.95, 4.0), "dense_s1": parity_curve(5.0, 3.97, 4.05)}
    c = bench.parity_checks(v)
    assert c["step"] == 30 and c["nsa_minus_dense"] == pytest.approx(0.1)
    assert c["best_nsa_minus_best_dense"] == pytest.approx(0.1)          # 4.0 - 3.9
    assert c["seed1"]["best_nsa_minus_best_dense"] == pytest.approx(-0.02)   # 3.95 - 3.97
    assert c["best_nsa_minus_best_dense_mean"] == pytest.approx(0.04)
    assert c["seed_spread"] == pytest.approx({"nsa": 0.05, "dense": 0.07})
    del v["dense_s1"]                     # one seed only: no spread, no seed1 entry
    c = bench.parity_checks(v)
    assert "seed1" not in c and "seed_spread" not in c


def test_parity_variants_pair_each_seed_with_the_same_overrides():
    bench = load_bench()
    par = bench.VARIANTS["parity"]
    assert set(par) == {"nsa", "dense", "nsa_s1", "dense_s1"}
    for att in ("nsa", "dense"):
        assert par[att + "_s1"] == par[att] + ["train.seed=1"]
