"""Tokenizers for the data pipeline: bundled GPT-2, a byte-level fallback, or any tokenizer.json.

``get_tokenizer(name)``:

* ``"gpt2"``  -- the bundled ``nsa_jax/assets/tokenizers/gpt2/tokenizer.json`` (vocab 50257,
  EOS ``<|endoftext|>`` = 50256). Truncation and padding are always disabled, so long documents
  are never cut.
* ``"byte"``  -- UTF-8 bytes, vocab 256. EOS is id 0 (the NUL byte); text containing NUL bytes
  therefore contains EOS ids (documented trade-off: keeps vocab at exactly 256).
* a path to a HuggingFace ``tokenizer.json`` (relative paths are resolved like ``data.path``).
  EOS is the first of ``<|endoftext|>``, ``</s>``, ``<eos>``, ``<|end_of_text|>``, ``[SEP]`` found.
  Encoding never adds special tokens (no BOS); documents are separated by EOS only.
"""
from __future__ import annotations

import functools
from pathlib import Path

from nsa_jax.data.errors import DataError
from nsa_jax.data.paths import resolve_path

_ASSETS = Path(__file__).resolve().parent.parent / "assets"
GPT2_PATH = _ASSETS / "tokenizers" / "gpt2" / "tokenizer.json"
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocab 256, EOS 0)."""

    name = "byte"
    vocab_size = 256
    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from tokenizer.json, truncation/padding disabled."""

    def __init__(self, path: Path, name: str):
        from tokenizers import Tokenizer  # core dependency; imported here to keep import light

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed json
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"data.tokenizer: cannot load {path} ({msg})") from None
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self.name = name
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        eos = next((tok.token_to_id(t) for t in EOS_CANDIDATES if tok.token_to_id(t) is not None),
                   None)
        if eos is None:
            raise DataError(f"data.tokenizer: {path} has no EOS token (looked for "
                            f"{', '.join(EOS_CANDIDATES)})")
        self.eos_id = int(eos)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


@functools.lru_cache(maxsize=8)
def get_tokenizer(name: str):
    """Return a tokenizer with ``encode``, ``encode_batch``, ``decode``, ``vocab_size``, ``eos_id``.

    Cached per name (tokenizers are stateless here), so building a fresh eval loader is cheap.
    """
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        if not GPT2_PATH.is_file():
            raise DataError(f"data.tokenizer: bundled GPT-2 tokenizer missing at {GPT2_PATH}")
        return HFTokenizer(GPT2_PATH, "gpt2")
    path = resolve_path(name)
    if not path.is_file():
        raise DataError(f"data.tokenizer: {name!r} is not 'gpt2', 'byte' or an existing "
                        f"tokenizer.json file")
    return HFTokenizer(path, str(name))
