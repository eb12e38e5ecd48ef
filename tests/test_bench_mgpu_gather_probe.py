"""bench/mgpu_gather_probe.py: the row-gather layouts a Mosaic GPU block-major backward would need
(one TMA per query into 8-row slices of a swizzled tile) lower for CUDA; exact 6-row slices do not.
CPU only: lowering, no PTX, no values."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import mgpu_gather_probe as probe  # noqa: E402


def test_one_copy_per_query_into_8_row_slots_lowers():
    assert "mosaic_gpu" in probe.lower("box8")


@pytest.mark.parametrize("mode", ["box6", "store6"])
def test_slices_of_a_tiled_tile_must_be_whole_8_row_tiles(mode):
    with pytest.raises(ValueError, match="divisible by the tile size"):
        probe.lower(mode)
