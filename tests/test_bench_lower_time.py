"""bench/lower_time.py: the host's share of a compile (trace + lower for CUDA, on the CPU) of a
model's gradient and prefill; the Triton modules built do not grow with the layers (the op and
the decoder's kernels lower once per program)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import lower_time  # noqa: E402

SMALL = ["model.dim=64", "model.n_heads=4", "model.n_kv_groups=2", "model.head_dim=16",
         "model.mlp_hidden=128", "model.vocab_size=512", "model.compute_dtype=bfloat16"]


def test_counts_do_not_grow_with_layers(tmp_path, capsys):
    got = {}
    for n in (1, 3):
        out = tmp_path / f"l{n}.json"
        assert lower_time.main(["--T", "256", "--what", "grad", "prefill", "--set", *SMALL,
                                f"model.n_layers={n}", "--out", str(out)]) == 0
        got[n] = json.loads(out.read_text())["programs"]
    for what in ("grad", "prefill"):
        assert got[1][what]["triton_modules"] >= 4
        assert got[3][what]["triton_modules"] == got[1][what]["triton_modules"], got
        assert got[3][what]["export_s"] > 0
    assert "Triton modules" in capsys.readouterr().out
