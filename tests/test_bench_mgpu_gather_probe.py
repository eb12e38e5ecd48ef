"""bench/mgpu_gather_probe.py: the row-gather layout a Mosaic GPU block-major backward needs (one
TMA per query into 8-row slices of a swizzled tile, each copy starting on a whole tile of a padded
layout) lowers for CUDA; exact 6-row slices do not; the free-reshape layout's copies start off
the tile. CPU only: lowering and layout arithmetic, no PTX, no values."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import mgpu_gather_probe as probe  # noqa: E402


def test_one_copy_per_query_into_8_row_slots_of_the_padded_layout_lowers():
    assert "mosaic_gpu" in probe.lower("box8p")


def test_only_the_padded_layout_starts_every_copy_on_a_whole_tile():
    """Mosaic GPU divides a tiled copy's global start by the tile: box8's starts (12 t + 6 g)
    are not whole 8-row tiles, box8p's all are."""
    starts = {m: [probe.row_start(m)(t, g) for t in range(probe.T) for g in range(probe.G)]
              for m in ("box8", "box8p")}
    assert any(r % 8 for r in starts["box8"])
    assert all(r % 8 == 0 for r in starts["box8p"])
    with pytest.raises(ValueError, match="box6"):
        probe.row_start("box6")


@pytest.mark.parametrize("mode", ["box6", "store6"])
def test_slices_of_a_tiled_tile_must_be_whole_8_row_tiles(mode):
    with pytest.raises(ValueError, match="divisible by the tile size"):
        probe.lower(mode)
