import os
import pkgutil


def _gpu_plugin_installed() -> bool:
    try:
        import jax_plugins
    except ImportError:
        return False
    names = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    return any("cuda" in n or "rocm" in n for n in names)


def _cpu_test_flags() -> str:
    import jaxlib.version  # no backend yet

    flags = "--xla_backend_optimization_level=0"
    if jaxlib.version.__version_info__[:2] == (0, 10):
        flags += " --xla_cpu_use_fusion_emitters=false"
    return flags


# Test speed only, CPU machines only: XLA's CPU backend compiles at LLVM -O0. The suite is bound
# by compile time (thousands of small programs, interpret-mode kernels), which this halves; the
# programs' results are the same, only slower to run. Also test speed only: XLA's CPU fusions
# go through its elemental IR emitters instead of the MLIR fusion emitters
# (xla_cpu_use_fusion_emitters=false): the same HLO compiles in about half the time (an
# interpret-mode NSA forward + backward 3.6 -> 2.0 s; the whole suite 13.6 -> 8.1 min on a
# 2-core machine), every test passes either way. XLA aborts on a flag it does not know, so that
# one is set only on the jaxlib releases it was checked with (0.10.x). Subprocesses inherit the
# flags. Set before jax starts its backend; a machine with a GPU plugin keeps its own flags.
if not _gpu_plugin_installed() and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _cpu_test_flags()).strip()


def shared_gpu_env(environ, gpu_plugin: bool) -> dict:
    """The variables a pytest-xdist worker sets before jax starts when the workers share GPUs:
    XLA's client reserves 75% of a GPU's memory per process at its start (its default), which
    leaves a later worker on the same GPU (``-n 2``, the README's CPU command, run on a GPU
    machine) only what is left. Without preallocation the workers take memory as they go.
    Nothing where the run is not an xdist worker, there is no GPU plugin, or the user set
    ``XLA_PYTHON_CLIENT_PREALLOCATE``. Measured on one H200 (bench/NOTES.md, forty-second
    session): 8 workers without preallocation ran the GPU suite with 3 of 61 tests out of
    memory where they coincided; alone those pass."""
    if not gpu_plugin or "PYTEST_XDIST_WORKER" not in environ:
        return {}
    if "XLA_PYTHON_CLIENT_PREALLOCATE" in environ:
        return {}
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


os.environ.update(shared_gpu_env(os.environ, _gpu_plugin_installed()))

import jax  # noqa: E402
import pytest  # noqa: E402

# Tests compare against float32 references; keep matmuls exact on every backend.
jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
