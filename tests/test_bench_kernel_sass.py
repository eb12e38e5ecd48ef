"""bench/kernel_sass.py: the Triton IR it writes per kernel (CPU lowering) and its SASS loop parser
(a fixture listing). The compile step needs pip ``triton`` in another environment; not run here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import kernel_sass  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FFMA R2, R3, R4, -R5 ;
        /*0020*/                   MUFU.EX2 R2, R2 ;
        /*0030*/              @P0 FADD R6, R6, R2 ;
        /*0040*/              @!P1 BRA 0x10 ;
        /*0050*/                   BRA 0x60 ;
        /*0060*/                   EXIT ;
"""


def test_loops_finds_the_back_branch_and_counts_its_body():
    (n, ops), = kernel_sass.loops(SASS)   # the forward branch at 0x50 is not a loop
    assert n == 4
    assert ops == {"FFMA": 1, "MUFU": 1, "FADD": 1, "BRA": 1}


def test_compare_prints_both_trees(tmp_path, capsys):
    for tree, n in (("old", 364), ("new", 336)):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "sass.json").write_text(json.dumps(
            {"04_nsa_sel_tiled_fwd": {"registers": 127, "instructions": 900,
                                      "loops": [{"instructions": n, "ops": {}}]}}))
    kernel_sass.compare(str(tmp_path / "old"), str(tmp_path / "new"))
    assert "364 -> 336" in capsys.readouterr().out


def _lower(out, *args) -> list[str]:
    """kernel_sass.lower('.', out, *args) in a subprocess (lower() patches cuDNN out of the
    window branch in the modules it imports) -> the IR files' names, in order."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kernel_sass; "
            f"kernel_sass.lower('.', sys.argv[2], *{args!r})")
    subprocess.run([sys.executable, "-c", code, str(BENCH), str(out)], check=True,
                   cwd=BENCH.parent)
    return sorted(p.name for p in out.glob("*.ttir"))


def test_lower_writes_one_ir_file_per_kernel(tmp_path):
    out = tmp_path / "ir"
    names = _lower(out, "tiled", "125m", 256)
    assert [n for n in names if "sel_tiled" in n] == [
        n for n in names if n.endswith(("nsa_sel_tiled_fwd.ttir", "nsa_sel_tiled_bwd_dq.ttir",
                                        "nsa_sel_tiled_bwd_dkv.ttir"))]
    assert len([n for n in names if "sel_tiled" in n]) == 3
    assert all("tt.func" in (out / n).read_text() for n in names)


def test_lower_decode_route_writes_the_decode_kernels(tmp_path):
    """``--route decode``: one decode step's Pallas kernels (all three branches), in launch order."""
    names = [n.split("_", 1)[1] for n in _lower(tmp_path / "ir", "decode", "125m", 4096, 2)]
    assert names == ["nsa_decode_cmp.ttir", "nsa_decode_score.ttir", "nsa_decode_topn.ttir",
                     "nsa_decode_slc_win.ttir", "nsa_decode_finish.ttir"]


def test_cli_needs_the_triton_python(capsys):
    with pytest.raises(SystemExit):
        kernel_sass.main(["/tmp/x"])
    assert "--triton-python" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--choice", "sel_bwd"], "KEY=VALUE"),
    (["--route", "decode", "--choice", "sel_bwd=atomic"], "not --route decode")])
def test_cli_rejects_a_bad_choice(argv, msg, capsys):
    """``--choice``: one clear argparse error for a malformed pair or a decode route, before any
    lowering."""
    with pytest.raises(SystemExit):
        kernel_sass.main(["/tmp/x", "--triton-python", "/nonexistent/python", *argv])
    assert msg in capsys.readouterr().err


def test_lower_takes_kernel_choices(tmp_path):
    """``--choice`` reaches the op's lowering: ``sel_bwd=atomic`` on the query route writes the
    per-query backward with atomic dK/dV in place of the inverted dK/dV kernel."""
    names = _lower(tmp_path / "ir", "query", "125m", 256, 8, ["sel_bwd=atomic"])
    assert any(n.endswith("nsa_sel_bwd_atomic.ttir") for n in names), names
    assert not any(n.endswith("nsa_sel_bwd_dkv.ttir") for n in names), names
