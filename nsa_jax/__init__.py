"""nsa_jax: DeepSeek's Native Sparse Attention (arXiv 2502.11089) in JAX/Flax with Pallas kernels."""
__version__ = "0.1.0"
