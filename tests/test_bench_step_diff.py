"""bench/step_diff.py (two step profiles compared) on synthetic profiles shaped like
bench/profile_step.py's, bench/profile_step.py's host-event summary of a synthetic trace, and the
argument checks of bench/ab_step.sh and bench/ab_op.sh (their runs need a GPU)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import step_diff  # noqa: E402


def _op(name, ms, calls=12, cat="fusion (elementwise/reduce)"):
    return {"name": name, "ms_per_step": ms, "calls_per_step": calls, "category": cat}


def _point(busy, ops, model="nsa_125m", T=2048, B=16):
    cats = {}
    for o in ops:
        cats.setdefault(o["category"], {"ms_per_step": 0.0})["ms_per_step"] += o["ms_per_step"]
    return {"model": model, "seq_len": T, "batch": B, "device_busy_ms_per_step": busy,
            "by_category": cats, "top_ops": ops}


K = "attention (pallas/triton)"
# the thirty-fourth session's call 1, reduced: XLA gave the dQ sum's number (_36) to the window
# cotangent's conversion (_48 before), and the dQ kernels grew
BEFORE = _point(95.30, [_op("nsa_sel_tiled_bwd_dq", 4.664, cat=K), _op("nsa_cmp_bwd_dq", 1.261, cat=K),
                        _op("loop_convert_fusion_36", 1.182), _op("loop_convert_fusion_48", 0.463),
                        _op("loop_convert_fusion_50", 0.895, calls=24),
                        _op("input_reduce_fusion_9", 0.30), _op("tail_fusion", 0.10, calls=1)])
AFTER = _point(94.11, [_op("nsa_sel_tiled_bwd_dq", 5.077, cat=K), _op("nsa_cmp_bwd_dq", 1.551, cat=K),
                       _op("loop_convert_fusion_36", 0.483),
                       _op("loop_convert_fusion_38", 0.892, calls=24),
                       _op("input_concatenate_fusion_34", 0.104), _op("new_big_fusion", 0.70),
                       _op("tail2_fusion", 0.28)])


def test_reused_and_renamed_xla_names_are_paired_by_calls_and_time():
    d = step_diff.diff_point(BEFORE, AFTER, min_ms=0.05)
    rows = {r["name"]: r for r in d["ops"]}
    # _36's number went to another op: the old _36 (the dQ sum) is gone, not "-0.70 ms"
    assert rows["loop_convert_fusion_36"]["before"] == 1.182
    assert rows["loop_convert_fusion_36"]["after"] is None
    assert ("loop_convert_fusion_48", "loop_convert_fusion_36") in d["renamed"]
    assert ("loop_convert_fusion_50", "loop_convert_fusion_38") in d["renamed"]
    # stable kernel names are trusted across any change
    assert rows["nsa_sel_tiled_bwd_dq"]["delta"] == pytest.approx(0.413)
    assert rows["nsa_cmp_bwd_dq"]["how"] == "same name"
    # renamed pairs that moved less than min_ms are not listed as movers
    assert not any("_48" in n for n in rows)
    assert d["busy"] == (95.30, 94.11)


def test_ops_in_one_list_only_are_bounded_by_the_other_lists_cut():
    d = step_diff.diff_point(BEFORE, AFTER, min_ms=0.05)
    rows = {r["name"]: r for r in d["ops"]}
    # above the other list's cut (0.10 before): a new op, bounded
    assert rows["new_big_fusion"]["how"].startswith("only after (before: new or <= 0.100")
    assert rows["input_reduce_fusion_9"]["how"].startswith("only before (after: gone or <= 0.104")
    # no longer than the other list's cut: not compared at all
    assert "input_concatenate_fusion_34" not in rows and "tail_fusion" not in rows
    assert d["uncompared"] == 2
    assert [r["delta"] for r in d["ops"]] == sorted(r["delta"] for r in d["ops"])


def test_cli_prints_and_writes_json_and_rejects_profiles_without_a_common_point(tmp_path, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps({"points": [BEFORE]}))
    b.write_text(json.dumps({"points": [AFTER, {"model": "x", "seq_len": 1, "batch": 1,
                                                "error": "failed"}]}))
    c.write_text(json.dumps({"points": [_point(1.0, [], T=4096)]}))
    out = tmp_path / "d.json"
    assert step_diff.main([str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "device busy 95.30 -> 94.11 ms/step (-1.19 ms, -1.25%)" in text
    assert "loop_convert_fusion_36" in text
    assert set(json.loads(out.read_text())) == {"nsa_125m:2048:16"}
    assert step_diff.main([str(a), str(c)]) == 2
    assert "no point is in both" in capsys.readouterr().err


def test_cli_takes_two_op_profiles(tmp_path, capsys):
    """bench/profile_op.py writes one op's profile with no points (the thirty-fifth session's
    call 4, reduced): it is one point, keyed by its shape, T and B."""
    def op_profile(busy, ops, T=65536):
        p = _point(busy, ops)
        for k in ("model", "seq_len", "batch"):
            del p[k]
        return {"shape": "bench", "T": T, "B": 1, **p}
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(op_profile(102.06, [_op("nsa_sel_bwd_dq", 18.40, 1, K),
                                                _op("loop_convert_fusion", 1.198, 1)])))
    b.write_text(json.dumps(op_profile(103.21, [_op("nsa_sel_bwd_dq", 21.288, 1, K),
                                                _op("nsa_topn", 0.049, 1, K)])))
    c.write_text(json.dumps(op_profile(1.0, [], T=8192)))
    assert step_diff.main([str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "== op bench T=65536 B=1: device busy 102.06 -> 103.21" in text
    assert "nsa_sel_bwd_dq" in text and "loop_convert_fusion" in text
    assert step_diff.main([str(a), str(c)]) == 2


@pytest.mark.parametrize("args,msg", [([], "usage: bash bench/ab_step.sh"),
                                      (["/nonexistent", "nsa_125m:2048:16"], "no nsa_jax/"),
                                      ([".", "nsa_125m:2048"], "point must be MODEL:T:B")])
def test_ab_step_rejects_bad_arguments_before_any_run(args, msg):
    r = subprocess.run(["bash", "bench/ab_step.sh", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize("args,msg", [([], "usage: bash bench/ab_op.sh"),
                                      (["/nonexistent", "bench:65536:1"], "no nsa_jax/"),
                                      ([".", "bench:65536"], "point must be SHAPE:T:B"),
                                      ([".", "bench:65536:1", "300", "0"], "ROUNDS must be"),
                                      ([".", "bench:65536:1", "300", "x"], "ROUNDS must be")])
def test_ab_op_rejects_bad_arguments_before_any_run(args, msg):
    r = subprocess.run(["bash", "bench/ab_op.sh", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)


def test_profile_step_sums_host_events_by_thread_and_name_without_the_gpu():
    """``profile_step.host_events``: the host threads' events summed by (thread, name), most
    first, per step; the GPU process's kernels and metadata events left out."""
    import profile_step
    M = "M"
    trace = {"traceEvents": [
        {"ph": M, "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": M, "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": M, "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python3"}},
        {"ph": M, "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "Stream #1"}},
        {"ph": "X", "pid": 1, "tid": 7, "name": "Execute", "ts": 0, "dur": 3000},
        {"ph": "X", "pid": 1, "tid": 7, "name": "Execute", "ts": 5000, "dur": 1000},
        {"ph": "X", "pid": 1, "tid": 7, "name": "update", "ts": 100, "dur": 500},
        {"ph": "X", "pid": 2, "tid": 1, "name": "kernel", "ts": 0, "dur": 9000},
    ]}
    got = profile_step.host_events(trace, steps=2, top=5)
    assert got == [
        {"thread": "python3", "name": "Execute", "ms_per_step": 2.0, "calls_per_step": 1.0},
        {"thread": "python3", "name": "update", "ms_per_step": 0.25, "calls_per_step": 0.5}]
