"""Torch-free data pipeline: tokenizers, sources (synthetic, text, hf, tokens, retrieval),
prefetching loader.

    from nsa_jax.data import build_loader, get_tokenizer, DataError

Modules: ``loader`` (build_loader, prefetch thread, exact state), ``batch`` (the Batch every
source yields: tokens, loss_mask, segment_ids), ``synthetic`` (generated
streams with learnable structure), ``retrieval`` (key-value pairs in filler, queries at the
end, accuracy against distance), ``text`` (packing documents into windows; text and hf
sources), ``documents`` (.txt/.jsonl/.parquet readers), ``hf`` (``datasets`` streaming),
``split`` (train/eval and per-process document assignment), ``tokens`` + ``shards``
(memory-mapped pretokenized shards), ``prepare`` (CLI writing shards), ``retry``, ``paths``,
``tokenizer``. Nothing here imports jax or torch.
"""
from nsa_jax.data.batch import Batch
from nsa_jax.data.errors import DataError
from nsa_jax.data.loader import Loader, build_loader
from nsa_jax.data.tokenizer import get_tokenizer

__all__ = ["Batch", "DataError", "Loader", "build_loader", "get_tokenizer"]
