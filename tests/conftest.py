import os
import pkgutil


def _gpu_plugin_installed() -> bool:
    try:
        import jax_plugins
    except ImportError:
        return False
    names = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    return any("cuda" in n or "rocm" in n for n in names)


# Test speed only, CPU machines only: XLA's CPU backend compiles at LLVM -O0. The suite is bound
# by compile time (thousands of small programs, interpret-mode kernels), which this halves; the
# programs' results are the same, only slower to run. Subprocesses inherit it. Set before jax
# starts its backend; a machine with a GPU plugin keeps its own flags.
if not _gpu_plugin_installed() and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

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
