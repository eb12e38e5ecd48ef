"""nsa_jax: DeepSeek's Native Sparse Attention (arXiv 2502.11089) in JAX/Flax with Pallas kernels.

``nsa_jax.load_run(run_dir, step=None)`` loads a trained run for generation
(:mod:`nsa_jax.inference`); it is imported on first use, so ``import nsa_jax`` stays cheap.
"""
__version__ = "0.1.0"
__all__ = ["load_run", "Run"]


def __getattr__(name):
    if name in ("load_run", "Run"):
        from nsa_jax import inference
        return getattr(inference, name)
    raise AttributeError(f"module 'nsa_jax' has no attribute {name!r}")
