"""NSA math: configuration, compression φ, block selection and the three-branch attention.

Public API (fixed; other modules and external checks depend on it)::

    from nsa_jax.nsa import NSAConfig, nsa_attention, select_blocks
"""
from nsa_jax.nsa.attention import nsa_attention, select_blocks
from nsa_jax.nsa.config import BRANCHES, NSAConfig, NSAConfigError

__all__ = ["NSAConfig", "NSAConfigError", "BRANCHES", "nsa_attention", "select_blocks"]
