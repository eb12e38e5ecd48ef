"""Path resolution for data files: cwd first, then the repository / package root.

A relative path (or glob) that matches nothing relative to the current directory is tried again
relative to the directory that contains the ``nsa_jax`` package (the repository root in a
checkout, site-packages when installed) and then relative to the package itself, so the bundled
``nsa_jax/assets/data/fineweb_edu_sample.jsonl`` works from any working directory.
"""
from __future__ import annotations

import glob as _glob
from pathlib import Path

from nsa_jax.data.errors import DataError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
ROOTS = (PACKAGE_DIR.parent, PACKAGE_DIR)
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")


def _has_magic(s: str) -> bool:
    return _glob.has_magic(s)


def resolve_path(path: str) -> Path:
    """Resolve a single (non-glob) path: as given if it exists, else against the package roots."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    for root in ROOTS:
        q = root / p
        if q.exists():
            return q
    return p


def _glob_sorted(pattern: str) -> list[Path]:
    return sorted(Path(m) for m in _glob.glob(pattern, recursive=True) if Path(m).is_file())


def expand_files(path: str, key: str = "data.path",
                 suffixes: tuple[str, ...] = TEXT_SUFFIXES) -> list[Path]:
    """File, directory (recursive, files with ``suffixes``) or glob -> sorted list of files."""
    if not path:
        raise DataError(f"{key}: required")
    expanded = str(Path(path).expanduser())
    if _has_magic(expanded):
        files = _glob_sorted(expanded)
        if not files and not Path(expanded).is_absolute():
            for root in ROOTS:
                files = _glob_sorted(str(root / expanded))
                if files:
                    break
        if not files:
            raise DataError(f"{key}: glob {path!r} matched no files")
    else:
        p = resolve_path(expanded)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes)
            if not files:
                raise DataError(f"{key}: directory {p} has no {'/'.join(suffixes)} files")
        elif p.is_file():
            files = [p]
        else:
            raise DataError(f"{key}: {path} does not exist")
    for f in files:
        if f.suffix not in suffixes:
            raise DataError(f"{key}: {f}: unsupported file type {f.suffix!r} "
                            f"(use {', '.join(suffixes)})")
    return files
