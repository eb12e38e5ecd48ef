"""Torch-free data pipeline: tokenizers, sources (synthetic, text, hf, tokens), prefetching loader.

    from nsa_jax.data import build_loader, get_tokenizer, DataError
"""
from nsa_jax.data.errors import DataError
from nsa_jax.data.loader import Loader, build_loader
from nsa_jax.data.tokenizer import get_tokenizer

__all__ = ["DataError", "Loader", "build_loader", "get_tokenizer"]
