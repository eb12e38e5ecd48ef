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
