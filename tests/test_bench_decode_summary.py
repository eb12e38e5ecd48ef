"""bench/decode_summary.py: one line per bench/decode.py point, with one kernel's time per token."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import decode_summary  # noqa: E402


def test_one_line_per_point_with_the_kernel_in_us_per_token():
    doc = {"points": [
        {"model": "nsa_125m", "context": 65536, "batch": 8, "loop_ms": 0.7724, "step_ms": 2.1,
         "loop_profile": {"device_busy_ms_per_step": 0.651, "device_span_ms_per_step": 0.737,
                          "top_kernels": [{"name": "nsa_cache_write", "ms_per_step": 0.0305},
                                          {"name": "nsa_decode_cmp", "ms_per_step": 0.0948}]}},
        {"model": "dense_125m", "context": 65536, "batch": 8, "loop_ms": 1.299, "step_ms": 2.127}]}
    out = decode_summary.lines(doc, "after", "nsa_cache_write")
    assert out[0] == ("after   nsa_125m N=65536 B=8: loop 0.772 ms, step 2.100, loop busy 0.651, "
                      "span 0.737, nsa_cache_write 30.5 us per token")
    assert out[1].endswith("loop busy 0.000, span 0.000, nsa_cache_write 0.0 us per token")
    assert len(out) == 2


def test_top_lines_list_the_traced_points_largest_kernels():
    doc = {"points": [
        {"model": "nsa_125m", "context": 65536, "batch": 8,
         "loop_profile": {"n_kernels_per_step": 241.4, "top_kernels": [
             {"name": "nsa_decode_cmp", "ms_per_step": 0.0948, "calls_per_step": 12.0},
             {"name": "nsa_decode_slc_win", "ms_per_step": 0.0574, "calls_per_step": 12.0}]}},
        {"model": "dense_125m", "context": 65536, "batch": 8}]}
    out = decode_summary.top_lines(doc, 1)
    assert out == ["nsa_125m N=65536 B=8: kernels per token 241.4",
                   "       94.8 us  x 12.0  nsa_decode_cmp"]
