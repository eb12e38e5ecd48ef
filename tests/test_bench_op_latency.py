"""bench/op_latency.py: the host-event table it reads from a trace, and its argument check (the
timing itself runs on the device machine)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import op_latency  # noqa: E402


def test_host_top_sums_host_events_per_call_and_skips_the_gpu():
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
          {"ph": "X", "pid": 1, "name": "Execute", "dur": 3000.0, "ts": 0},
          {"ph": "X", "pid": 1, "name": "Execute", "dur": 1000.0, "ts": 5},
          {"ph": "X", "pid": 1, "name": "alloc", "dur": 500.0, "ts": 9},
          {"ph": "X", "pid": 2, "name": "kernel", "dur": 9000.0, "ts": 1}]
    top = op_latency.host_top({"traceEvents": ev}, calls=2)
    assert [t["name"] for t in top] == ["Execute", "alloc"]
    assert top[0]["ms_per_call"] == pytest.approx(2.0)
    assert top[0]["count_per_call"] == 1.0
    assert top[1]["ms_per_call"] == pytest.approx(0.25)


def test_refuses_fewer_than_two_reps(capsys):
    with pytest.raises(SystemExit):
        op_latency.main(["--reps", "1"])
    assert "--reps: at least 2, got 1" in capsys.readouterr().err
