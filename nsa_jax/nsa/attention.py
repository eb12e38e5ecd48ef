"""``nsa_attention``: the NSA attention op (Eq. 5), dispatching to an implementation.

``impl="reference"`` is pure jax.numpy (``nsa_jax.nsa.reference``), the oracle. Kernel
implementations register themselves in ``IMPLS`` (``nsa_jax.pallas`` adds ``"pallas"``).
"""
from __future__ import annotations

from typing import Callable

import jax

from nsa_jax.nsa import reference
from nsa_jax.nsa.config import NSAConfig

IMPLS: dict[str, Callable] = {"reference": reference.nsa_attention_reference}


def _check_shapes(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg):
    if q.ndim != 4:
        raise ValueError(f"q must be [B,T,Hq,Dk], got shape {q.shape}")
    B, T, Hq, Dk = q.shape
    G = k_slc.shape[2] if k_slc.ndim == 4 else None
    Tc = cfg.num_cmp_blocks(T)
    want = {
        "k_cmp": (k_cmp, (B, Tc, G, Dk)), "k_slc": (k_slc, (B, T, G, Dk)),
        "k_win": (k_win, (B, T, G, Dk)), "gates": (gates, (B, T, Hq, 3)),
    }
    for name, (a, shape) in want.items():
        if tuple(a.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (q is {q.shape}, Tc={Tc}, "
                             f"G={G}), got {a.shape}")
    Dv = v_slc.shape[-1]
    for name, a, shape in (("v_cmp", v_cmp, (B, Tc, G, Dv)), ("v_slc", v_slc, (B, T, G, Dv)),
                           ("v_win", v_win, (B, T, G, Dv))):
        if tuple(a.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if Hq % G:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of KV groups G={G}")


def nsa_attention(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg: NSAConfig,
                  impl: str = "reference", **kwargs) -> jax.Array:
    """NSA attention output [B,T,Hq,Dv].

    q [B,T,Hq,Dk]; k_cmp [B,Tc,G,Dk], v_cmp [B,Tc,G,Dv] (already compressed by φ);
    k_slc, k_win [B,T,G,Dk]; v_slc, v_win [B,T,G,Dv]; gates [B,T,Hq,3] in [0,1] ordered
    (cmp, slc, win). float32 or bfloat16 inputs; softmaxes are float32; output has q's dtype.
    """
    if not isinstance(cfg, NSAConfig):
        raise TypeError(f"cfg must be an NSAConfig, got {type(cfg).__name__}")
    if impl not in IMPLS and impl == "pallas":
        import nsa_jax.pallas  # noqa: F401  (registers itself)
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; available: {sorted(IMPLS)}")
    _check_shapes(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg)
    return IMPLS[impl](q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg, **kwargs)


def select_blocks(q, k_cmp, cfg: NSAConfig, impl: str = "reference") -> jax.Array:
    """Selected block ids, int32 [B,T,G,n_sel], ascending, -1 for unused slots at the end."""
    if impl == "reference":
        return reference.select_blocks(q, k_cmp, cfg)
    if impl == "pallas":
        from nsa_jax.pallas import select_blocks_pallas
        return select_blocks_pallas(q, k_cmp, cfg)
    raise ValueError(f"unknown impl {impl!r}; choose 'reference' or 'pallas'")
