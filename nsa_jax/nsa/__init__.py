"""NSA math: configuration, compression φ, block selection and the three-branch attention.

Public API (fixed; other modules and external checks depend on it)::

    from nsa_jax.nsa import NSAConfig, nsa_attention, select_blocks

Backend choice: ``Backend`` and ``resolve_impl`` (``"auto"`` picks by device); the kernels'
algorithm choices: ``KernelChoices`` (``nsa_attention(..., choices=...)``).
"""
from nsa_jax.nsa.attention import Backend, nsa_attention, resolve_impl, select_blocks
from nsa_jax.nsa.config import BRANCHES, NSAConfig, NSAConfigError
from nsa_jax.nsa.options import KernelChoices

__all__ = ["NSAConfig", "NSAConfigError", "BRANCHES", "Backend", "KernelChoices",
           "nsa_attention", "resolve_impl", "select_blocks"]
