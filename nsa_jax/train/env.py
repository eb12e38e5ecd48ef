"""``env.json``: what a run ran on (library versions, devices, git commit, host)."""
from __future__ import annotations

import datetime
import importlib.metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path

import jax

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "tokenizers",
            "tensorboard", "nsa-jax")


def _version(pkg: str):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_info(where: Path | None = None) -> dict | None:
    """``{"commit", "dirty"}`` of the checkout holding this package, or None outside git."""
    where = where or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5)
        if commit.returncode:
            return None
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=10)
        return {"commit": commit.stdout.strip(),
                "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return None


def collect_env(argv: list[str] | None = None) -> dict:
    versions = {p: _version(p) for p in PACKAGES}
    versions["python"] = sys.version.split()[0]
    if versions["nsa-jax"] is None:
        import nsa_jax
        versions["nsa-jax"] = nsa_jax.__version__
    devices = [{"id": d.id, "platform": d.platform, "kind": d.device_kind,
                "process_index": d.process_index} for d in jax.devices()]
    return {
        "versions": versions,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "process_index": jax.process_index(),
        "devices": devices,
        "git": git_info(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "argv": list(sys.argv if argv is None else argv),
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
