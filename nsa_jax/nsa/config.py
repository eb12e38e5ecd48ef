"""NSAConfig: the hyper-parameters of Native Sparse Attention (arXiv 2502.11089, §3).

Notation follows the paper: compression block length ``l`` (``block_l``) and stride ``d``
(``stride_d``), selection block length ``l'`` (``sel_block``), number of selected blocks ``n``
(``n_sel``), sliding window ``w`` (``window``). ``n_init`` initial blocks and ``n_local`` most recent
blocks are always selected and count within ``n`` (§3.3.2).
"""
from __future__ import annotations

import dataclasses

BRANCHES = ("cmp", "slc", "win")


class NSAConfigError(ValueError):
    """An invalid NSA hyper-parameter; the message names the field."""


@dataclasses.dataclass(frozen=True)
class NSAConfig:
    block_l: int = 32
    stride_d: int = 16
    sel_block: int = 64
    n_sel: int = 16
    window: int = 512
    n_init: int = 1
    n_local: int = 2
    branches: tuple[str, ...] = BRANCHES

    def __post_init__(self):
        # YAML gives lists; keep the dataclass hashable (it is a static jit argument).
        object.__setattr__(self, "branches", tuple(self.branches))
        self.validate()

    def validate(self) -> None:
        def fail(field, msg):
            raise NSAConfigError(f"nsa.{field}: {msg}")

        for f in ("block_l", "stride_d", "sel_block", "n_sel", "window"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                fail(f, f"must be a positive integer, got {v!r}")
        for f in ("n_init", "n_local"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                fail(f, f"must be a non-negative integer, got {v!r}")
        if self.block_l % self.stride_d:
            fail("block_l", f"block_l={self.block_l} must be a multiple of stride_d={self.stride_d}")
        if self.sel_block % self.stride_d:
            fail("sel_block", f"sel_block={self.sel_block} must be a multiple of stride_d={self.stride_d}")
        if self.block_l > self.sel_block:
            fail("block_l", f"block_l={self.block_l} must be <= sel_block={self.sel_block}")
        if self.n_sel < self.n_init + self.n_local:
            fail("n_sel", f"n_sel={self.n_sel} must be >= n_init + n_local = {self.n_init + self.n_local}")
        if not self.branches:
            fail("branches", "at least one of cmp, slc, win is required")
        for b in self.branches:
            if b not in BRANCHES:
                fail("branches", f"unknown branch {b!r}; choose from {list(BRANCHES)}")
        if len(set(self.branches)) != len(self.branches):
            fail("branches", f"duplicate branch in {list(self.branches)}")

    # ---- derived sizes -------------------------------------------------------------------
    def num_cmp_blocks(self, T: int) -> int:
        """Tc = max(0, floor((T - l) / d) + 1): compressed blocks [i*d, i*d + l) inside T tokens."""
        return max(0, (T - self.block_l) // self.stride_d + 1)

    def num_sel_blocks(self, T: int) -> int:
        """ceil(T / l'): selection blocks [j*l', (j+1)*l') that hold at least one token."""
        return -(-T // self.sel_block)

    def branch_mask(self) -> tuple[float, float, float]:
        """1.0 for enabled branches in gate order (cmp, slc, win), 0.0 for ablated ones."""
        return tuple(1.0 if b in self.branches else 0.0 for b in BRANCHES)
