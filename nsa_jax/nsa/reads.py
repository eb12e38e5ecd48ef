"""Keys each attention reads to decode one token (paper Table 4's "expected number of memory
access"): :func:`decode_reads` for NSA's branches, :func:`dense_reads` for dense attention; the
decode benchmark (``bench/decode.py``) divides bytes by these."""
from __future__ import annotations

from nsa_jax.nsa.config import NSAConfig


def decode_reads(t: int, cfg: NSAConfig, convention: str = "exact") -> dict[str, int]:
    """Keys read by each branch when decoding position t (0-based; the context is N = t+1 tokens).

    ``exact`` (what :func:`nsa_jax.nsa.decoding.nsa_decode_attention` attends to):
      * cmp: Tc = ⌊(N - l)/d⌋ + 1 complete compressed blocks (0 while N < l);
      * slc: min(n·l', N): n selected blocks of l' tokens, clipped to the valid tokens. This is
        exact when N <= n·l' or l' divides N; otherwise the current (forced) block is partial and
        it is the block-granular read a kernel does (keys past t are masked);
      * win: min(w, N).
    ``paper`` (Table 4 of arXiv 2502.11089, "expected number of memory access"): cmp counts one
      compressed token per stride, ⌊N/d⌋, i.e. it ignores the l/d - 1 incomplete trailing
      blocks; slc and win as above. At N = 65536 with l=32, d=16, l'=64, n=16, w=512 this gives
      4096 + 1024 + 512 = 5632 (Table 4), while the exact count is 4095 + 1024 + 512 = 5631.
    Ablated branches read 0. ``total`` is the sum.
    """
    if convention not in ("exact", "paper"):
        raise ValueError(f"convention must be 'exact' or 'paper', got {convention!r}")
    if t < 0:
        raise ValueError(f"t must be >= 0, got {t}")
    N = t + 1
    br = cfg.branches
    cmp = cfg.num_cmp_blocks(N) if convention == "exact" else N // cfg.stride_d
    out = {
        "cmp": cmp if "cmp" in br else 0,
        "slc": min(cfg.n_sel * cfg.sel_block, N) if "slc" in br else 0,
        "win": min(cfg.window, N) if "win" in br else 0,
    }
    out["total"] = out["cmp"] + out["slc"] + out["win"]
    return out


def dense_reads(t: int) -> int:
    """Keys read by dense attention at position t: the whole context, t+1."""
    return t + 1
