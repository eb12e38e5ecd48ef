"""bench/shape_audit.py's variant lists and argument parsing (its timings run only on a GPU)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import shape_audit  # noqa: E402


def test_variants_are_the_alternatives_auto_decides_between():
    short = dict(shape_audit.variants(2, 64, 2048))
    assert short["default"] == {}
    assert short["sel_impl=gather"] == {"sel_impl": "gather"}
    assert short["tiled fwd+dq=mosaic"] == {"sel_tiled_fwd": "mosaic", "sel_tiled_dq": "mosaic"}
    assert short["tiled dkv=triton"] == {"sel_tiled_dkv": "triton"}
    assert dict(shape_audit.variants(4, 128, 2048))["tiled fwd+dq=triton"] == {
        "sel_tiled_fwd": "triton", "sel_tiled_dq": "triton"}
    # above sel_tiled_max_t: the tiled kernels and the other gather forward (block <-> query)
    assert dict(shape_audit.variants(6, 64, 8192)) == {
        "default": {}, "sel_impl=tiled": {"sel_impl": "tiled"}, "sel_fwd=query": {"sel_fwd": "query"}}
    assert dict(shape_audit.variants(16, 128, 8192))["sel_fwd=block"] == {"sel_fwd": "block"}


def test_explicit_variants_are_typed_kernel_choices():
    assert shape_audit.parse_variant("default") == ("default", {})
    assert shape_audit.parse_variant("x:sel_tiled_max_t=8192,sel_impl=tiled") == (
        "x", {"sel_tiled_max_t": 8192, "sel_impl": "tiled"})
    with pytest.raises(SystemExit, match="Hq/G/D"):
        shape_audit.parse_heads("16x4x64")
    with pytest.raises(SystemExit, match="multiple of G"):
        shape_audit.parse_heads("12/5/64")
