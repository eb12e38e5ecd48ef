"""Pretokenize a text or hf source into shards: ``python -m nsa_jax.data.prepare``.

    python -m nsa_jax.data.prepare --config configs/prepare_sample.yaml [data.key=value ...]

Reads every document of ``data.source`` (text or hf; ``data.max_docs`` caps the count), tokenizes
with ``data.tokenizer`` (documents joined by EOS, exactly like the text source's stream), and
writes ``uint16`` (vocab <= 65536) or ``uint32`` shards of ``data.shard_tokens`` tokens plus
``index.json`` and the document boundaries (``documents.bin``, for ``data.packing: documents``) to
``data.out_dir`` -- atomically: a temporary sibling directory renamed into
place, removed on any error. Train with ``data.source: tokens`` and ``data.path: <out_dir>``.
Bad input (ConfigError / DataError) prints one line ``error: ...`` and exits with status 2.
"""
from __future__ import annotations

import sys
import time
from typing import Iterator

import numpy as np

from nsa_jax.config import ConfigError, load_config
from nsa_jax.data.errors import DataError
from nsa_jax.data.shards import dtype_for_vocab, write_dataset
from nsa_jax.data.text import doc_token_arrays
from nsa_jax.data.tokenizer import get_tokenizer
from nsa_jax.errors import (EXIT_BAD_INPUT, EXIT_OK, OneLineParser, one_line, parse_args, report,
                            warn)
from nsa_jax.progress import Progress

PLAIN_EVERY_S = 10.0


def open_docs(d):
    """The document reader for a text or hf data config."""
    if d.source == "text":
        from nsa_jax.data.documents import LocalDocs
        from nsa_jax.data.paths import expand_files

        docs = LocalDocs(expand_files(d.path), d.text_field, d.max_docs)
    elif d.source == "hf":
        from nsa_jax.data.hf import HFDocs

        docs = HFDocs(d)
    else:
        raise DataError(f"data.source: prepare reads text or hf, got {d.source!r}")
    docs.check()
    return docs


def prepare(cfg, out=None) -> dict:
    """Write ``cfg.data`` as shards to ``cfg.data.out_dir``; returns the index dict."""
    out = out if out is not None else sys.stdout
    d = cfg.data
    if not d.out_dir:
        raise DataError("data.out_dir: required for prepare (where shards are written)")
    tok = get_tokenizer(d.tokenizer)
    docs = open_docs(d)
    progress = Progress(d.max_docs or None, unit="doc", stream=sys.stderr, every_s=PLAIN_EVERY_S)
    count = {"docs": 0, "tokens": 0}

    def status() -> str:
        return (f"prepare: {count['docs']} docs, {count['tokens']} tokens "
                f"({progress.rate(count['tokens']):,.0f} tok/s)")

    def arrays() -> Iterator[np.ndarray]:
        for _, toks in doc_token_arrays(docs, tok, 0):
            count["docs"] += 1
            count["tokens"] += len(toks)
            progress.update(1, status, tokens=count["tokens"])
            yield toks

    t0 = time.monotonic()
    progress.start()
    try:
        index = write_dataset(d.out_dir, arrays(), dtype=dtype_for_vocab(tok.vocab_size),
                              shard_tokens=d.shard_tokens,
                              meta={"vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
                                    "tokenizer": d.tokenizer, "source": docs.describe()})
    finally:
        progress.close()
    dt = time.monotonic() - t0
    print(f"prepared {index['docs']} docs, {index['total_tokens']} tokens, "
          f"{len(index['shards'])} shards ({index['dtype']}) in {dt:.1f}s -> {d.out_dir}",
          file=out, flush=True)
    return index


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m nsa_jax.data.prepare",
                       description="Pretokenize a text/hf source into token shards.")
    ap.add_argument("--config", required=True, help="YAML config (uses its data section)")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides")
    ap.add_argument("--debug", action="store_true", help="show tracebacks with errors")
    args, status = parse_args(ap, list(sys.argv[1:] if argv is None else argv))
    if args is None:
        return status
    try:
        notes: list[str] = []
        cfg = load_config(args.config, args.overrides, notes=notes)
        for note in notes:       # keys that moved, as the train CLI says them
            warn(note)
        prepare(cfg)
    except (ConfigError, DataError) as e:
        return report(one_line(e), EXIT_BAD_INPUT, args.debug)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
