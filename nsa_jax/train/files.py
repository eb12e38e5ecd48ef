"""Small files in the run directory, written so that a kill or a full disk never leaves one
half-written: the text goes to ``<name>.tmp`` and is renamed over ``<name>`` (atomic on POSIX).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def atomic_write_text(path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step; on error the old file stays as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
