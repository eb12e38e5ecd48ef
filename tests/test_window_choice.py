"""The sliding-window branch's implementation choice (``KernelChoices.win_attn``): the
document-local Pallas kernel with one document per row ("pallas", interpret mode here) in the
whole op against the reference (values and all 8 gradients, float32, <= 2e-5). The errors of a
choice that cannot run are tested with the compressed branch's (tests/test_cmp_grouped.py); the
cuDNN path itself runs only on a GPU (tests/test_pallas_gpu.py)."""
import pytest

from nsa_jax.nsa import KernelChoices, NSAConfig
from test_pallas import TINY, _assert_parity, _inputs


@pytest.mark.parametrize("cfg,T,h,G", [
    (TINY, 75, 3, 2),                           # w=16 < T, several groups and heads, odd T
    (NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=64), 45, 2, 1),  # w > T
])
def test_op_with_pallas_window_matches_reference(cfg, T, h, G):
    args, cot = _inputs(7 + h, 1, T, h * G, G, cfg)
    _assert_parity(args, cot, cfg, choices=KernelChoices(win_attn="pallas"))
