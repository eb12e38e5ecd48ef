"""JAX's persistent compilation cache, switched on by a directory (``exec.compile_cache``, the
generate CLI's ``--compile-cache``, or :func:`enable` from Python).

A compiled train step or prefill is written there, keyed by its lowered program, the devices and
the versions of jax, jaxlib and the XLA flags; a later process that lowers the same program on the
same kind of machine reads it back instead of compiling (XLA's GEMM autotuning results are kept
in the same directory). What is still paid each time is the Python tracing and lowering,
including each Pallas kernel's lowering to Triton IR, and loading the executables. Measured on
one H200 (jax 0.11.2; bench/NOTES.md, fifty-second session): the 64k chunked prefill of
nsa_125m at C = 16,384 compiled in 122.5 s with an empty cache and in 46.4 s in a second
process reading it.

The cache is process-wide JAX state: :func:`enable` sets it for every later compilation of the
process. Entries are only written for compilations longer than ``min_compile_s`` (JAX's
``jax_persistent_cache_min_compile_time_secs``, 1 s by default), so small programs do not fill
it. Entries are never evicted: delete the directory to reclaim its space.
"""
from __future__ import annotations

import os
from pathlib import Path

import jax


class CompileCacheError(ValueError):
    """The cache directory cannot be used: one line naming the setting (``key``) and the path."""


def enable(path, *, key: str = "exec.compile_cache", min_compile_s: float = 1.0) -> Path:
    """Use ``path`` as JAX's persistent compilation cache for the rest of the process; returns
    it resolved. Nothing is written here: JAX creates the directory at its first entry, so
    ``path`` must be a writable directory or have one as its nearest existing ancestor
    (:class:`CompileCacheError` naming ``key`` otherwise). Calling it again with the same path
    only sets ``min_compile_s``; with another path, later compilations use the new one."""
    if path is None or not str(path).strip():
        raise CompileCacheError(f"{key}: empty; give a directory or leave it unset")
    p = Path(os.path.expanduser(str(path))).resolve()
    if p.exists() and not p.is_dir():
        raise CompileCacheError(f"{key}: {p} exists and is not a directory")
    top = p      # the directory itself, or the ancestor JAX will create it in
    while not top.exists():
        top = top.parent
    if not top.is_dir():
        raise CompileCacheError(f"{key}: cannot create {p}: {top} is not a directory")
    if not os.access(top, os.W_OK | os.X_OK):
        raise CompileCacheError(f"{key}: {top} is not writable" if top == p
                                else f"{key}: cannot create {p}: {top} is not writable")
    if min_compile_s < 0:
        raise ValueError(f"min_compile_s: must be >= 0, got {min_compile_s}")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    if current() != p:
        from jax.experimental.compilation_cache import compilation_cache
        jax.config.update("jax_compilation_cache_dir", str(p))
        compilation_cache.reset_cache()   # the next compilation opens the new directory
    return p


def disable() -> None:
    """Stop using a persistent compilation cache in this process (what is written stays)."""
    if current() is None:
        return
    from jax.experimental.compilation_cache import compilation_cache
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()


def current() -> Path | None:
    """The directory in use, or None."""
    d = jax.config.jax_compilation_cache_dir
    return Path(d) if d else None
