"""``nsa_attention``: the NSA attention op (Eq. 5), and the one place that picks its backend.

Backends (``Backend``): ``reference`` is pure jax.numpy (``nsa_jax.nsa.reference``), the
oracle; ``pallas`` runs the Pallas-Triton kernels (``nsa_jax.pallas``; compiled on a GPU, through
the Pallas interpreter elsewhere). ``resolve_impl`` turns a configured name, including
``"auto"``, into a ``Backend``; kernels are imported only when their backend is used, so this
module imports no kernel code and nothing imports it back (no registration, no cycle).

Nothing falls back silently: an unknown name, or ``"auto"`` on a GPU whose kernels cannot be
imported, is an error naming the argument.
"""
from __future__ import annotations

import enum

import jax

from nsa_jax.nsa import reference, semantics
from nsa_jax.nsa.config import NSAConfig
from nsa_jax.nsa.options import KernelChoices


class Backend(str, enum.Enum):
    """Implementations of the NSA op. The values are the names configs use
    (``model.nsa_impl``)."""
    REFERENCE = "reference"
    PALLAS = "pallas"  # Pallas kernels lowered through Triton


AUTO = "auto"
IMPL_NAMES = (AUTO,) + tuple(b.value for b in Backend)


def resolve_impl(impl: str | Backend = AUTO, *, backend: str | None = None) -> Backend:
    """``impl`` (a ``Backend`` or one of ``IMPL_NAMES``) -> ``Backend``.

    ``"auto"`` is ``pallas`` when the JAX backend (``backend``, default
    ``jax.default_backend()``) is a GPU and ``reference`` elsewhere (on a CPU the kernels would
    run interpreted, slowly). On a GPU whose kernels fail to import, ``"auto"`` raises instead of
    quietly running the O(T^2) reference.
    """
    if isinstance(impl, Backend):
        return impl
    if impl not in IMPL_NAMES:
        raise ValueError(f"impl: unknown impl {impl!r}; choose one of {list(IMPL_NAMES)}")
    if impl != AUTO:
        return Backend(impl)
    if (backend or jax.default_backend()) != "gpu":
        return Backend.REFERENCE
    try:
        import nsa_jax.pallas.nsa  # noqa: F401
    except ImportError as e:
        raise ImportError(f"impl='auto' on a GPU needs the Pallas kernels, which failed to import "
                          f"({e}); pass impl='reference' to run the O(T^2) reference") from e
    return Backend.PALLAS


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


def _check_options(backend: Backend, choices, block_sizes):
    if choices is not None and not isinstance(choices, KernelChoices):
        raise TypeError(f"choices must be a KernelChoices, got {type(choices).__name__}")
    if block_sizes is not None and backend is not Backend.PALLAS:
        raise ValueError(f"block_sizes: tile sizes of the Pallas kernels; impl resolved to "
                         f"{backend.value!r}")


def nsa_attention(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg: NSAConfig,
                  impl: str | Backend = "reference", *, block_idx=None,
                  choices: KernelChoices | None = None, block_sizes=None,
                  segment_ids=None) -> jax.Array:
    """NSA attention output [B,T,Hq,Dv].

    q [B,T,Hq,Dk]; k_cmp [B,Tc,G,Dk], v_cmp [B,Tc,G,Dv] (already compressed by φ);
    k_slc, k_win [B,T,G,Dk]; v_slc, v_win [B,T,G,Dv]; gates [B,T,Hq,3] in [0,1] ordered
    (cmp, slc, win). float32 or bfloat16 inputs; softmaxes are float32; output has q's dtype.

    impl:        a ``Backend`` or name (``resolve_impl``; "auto" picks by device).
    block_idx:   int32 [B,T,G,n] block ids overriding the selection (-1 = unused slot; an id
                 repeated in a row selects its block once: Eq. 10 attends the union).
    choices:     ``KernelChoices``, how the kernels compute (never what); the reference
                 ignores them, so one config serves every backend. None = defaults.
    block_sizes: ``nsa_jax.pallas.BlockSizes`` tile sizes; pallas only.
    segment_ids: int32 [B,T], non-decreasing per row, one id per document: packed documents,
                 each attended as its own sequence (``nsa_jax.nsa.semantics``). k_cmp/v_cmp
                 are then in the per-document slot layout (``semantics.segment_layout``;
                 ``compression.compress(..., src=layout.cmp_src)`` makes it) and block ids
                 (``block_idx``, ``select_blocks``) are document-relative. None: one document
                 per row.
    """
    if not isinstance(cfg, NSAConfig):
        raise TypeError(f"cfg must be an NSAConfig, got {type(cfg).__name__}")
    backend = resolve_impl(impl)
    _check_options(backend, choices, block_sizes)
    _check_shapes(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg)
    if segment_ids is not None:
        semantics.check_segment_ids(segment_ids, q.shape[:2])
    args = (q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates, cfg)
    if backend is Backend.PALLAS:
        from nsa_jax.pallas.nsa import nsa_attention_pallas
        return nsa_attention_pallas(*args, block_idx=block_idx, block_sizes=block_sizes,
                                    choices=choices, segment_ids=segment_ids)
    return reference.nsa_attention_reference(*args, block_idx=block_idx,
                                             segment_ids=segment_ids)


def select_blocks(q, k_cmp, cfg: NSAConfig, impl: str | Backend = "reference", *,
                  choices: KernelChoices | None = None, block_sizes=None,
                  segment_ids=None) -> jax.Array:
    """Selected block ids, int32 [B,T,G,n_sel], ascending, -1 for unused slots at the end
    (document-relative with ``segment_ids``). Other arguments as in ``nsa_attention``."""
    backend = resolve_impl(impl)
    _check_options(backend, choices, block_sizes)
    if segment_ids is not None:
        semantics.check_segment_ids(segment_ids, q.shape[:2])
    if backend is Backend.PALLAS:
        from nsa_jax.pallas.nsa import select_blocks_pallas
        return select_blocks_pallas(q, k_cmp, cfg, block_sizes, choices=choices,
                                    segment_ids=segment_ids)
    return reference.select_blocks(q, k_cmp, cfg, segment_ids)
