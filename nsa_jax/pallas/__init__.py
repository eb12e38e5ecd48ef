"""Pallas (Triton) GPU kernels for NSA; ``nsa_attention(..., impl="pallas")``.

On a GPU the kernels compile through Pallas-Triton; elsewhere they run in Pallas interpret mode
(same kernel code), which is how the CPU tests exercise them. ``nsa_jax.nsa.attention`` imports
this package lazily when the pallas backend is used; nothing here registers itself.
"""
from nsa_jax.pallas.common import BlockSizes
from nsa_jax.pallas.nsa import (block_scores_pallas, nsa_attention_pallas, select_blocks_pallas,
                                selection_kernels)

__all__ = ["BlockSizes", "block_scores_pallas", "nsa_attention_pallas", "select_blocks_pallas",
           "selection_kernels"]
