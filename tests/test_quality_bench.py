"""bench/quality.py's parity report: the NSA - dense comparison and its seed-to-seed noise floor."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("quality_bench_p", ROOT / "bench" / "quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while defined
    spec.loader.exec_module(mod)
    return mod


def curve(*losses):
    return {"eval_curve": [{"step": 10 * (i + 1), "eval_loss": l} for i, l in enumerate(losses)]}


def test_parity_checks_with_two_seeds_report_each_seed_and_the_spread():
    bench = load_bench()
    v = {"nsa": curve(5.0, 4.0, 4.2), "dense": curve(5.0, 3.9, 4.1),
         "nsa_s1": curve(5.0, 3.95, 4.0), "dense_s1": curve(5.0, 3.97, 4.05)}
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
