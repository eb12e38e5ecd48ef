"""``python -m nsa_jax.generate``: sample text from a trained run with NSA KV caches.

    python -m nsa_jax.generate --checkpoint RUN_DIR [--prompt TEXT] [--max-new-tokens N]
        [--temperature T] [--top-k K] [--top-p P] [--seed S] [--step STEP]

Loads ``RUN_DIR/config.yaml`` and the newest checkpoint (``nsa_jax.train.checkpoint.
load_for_inference``), encodes the prompt with the run's tokenizer (``data.tokenizer``), prefills it
with the parallel forward, then decodes token by token (:mod:`nsa_jax.decode`), streaming the text
to stdout; the prompt is echoed first. An empty prompt starts from the tokenizer's EOS token.
Generation stops after N tokens or at EOS (which is not printed). Temperature 0 is greedy
decoding. Bad input (arguments, a missing or incompatible checkpoint, an unknown tokenizer)
prints one line ``error: ...`` on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
import traceback

import jax
import jax.numpy as jnp

EXIT_BAD_INPUT = 2


# ---- sampling -------------------------------------------------------------------------------
def filter_logits(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  vocab_limit: int | None = None):
    """Scaled, filtered float32 logits [..., V]: ids >= ``vocab_limit`` (vocabulary padding),
    outside the top ``top_k`` (0 = off) or outside the nucleus ``top_p`` (1 = off) get -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``
    (the most likely token is always kept). Ties at the top-k / top-p threshold are all kept.
    """
    x = logits.astype(jnp.float32)
    V = x.shape[-1]
    if vocab_limit is not None and vocab_limit < V:
        x = jnp.where(jnp.arange(V) < vocab_limit, x, -jnp.inf)
    if temperature > 0:
        x = x / temperature
    if 0 < top_k < V:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        srt = jnp.sort(x, axis=-1)[..., ::-1]
        p = jax.nn.softmax(srt, axis=-1)
        before = jnp.cumsum(p, axis=-1) - p          # mass of strictly more likely tokens
        keep = before < top_p                        # always true for the first token
        thr = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < thr, -jnp.inf, x)
    return x


@functools.partial(jax.jit,
                   static_argnames=("temperature", "top_k", "top_p", "vocab_limit"))
def sample(logits, key, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           vocab_limit: int | None = None):
    """Next token ids [...] from logits [..., V]. ``temperature == 0``: greedy (argmax)."""
    x = filter_logits(logits, temperature, top_k, top_p, vocab_limit)
    if temperature == 0:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)


# ---- streaming ------------------------------------------------------------------------------
class TextStream:
    """Decode a growing list of ids and emit only the new text (byte-level BPE can split a UTF-8
    character over tokens: text ending in U+FFFD is held back until it completes)."""

    def __init__(self, tokenizer, out):
        self.tok, self.out = tokenizer, out
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token_id: int) -> None:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return
        self.out.write(text[len(self.emitted):])
        self.out.flush()
        self.emitted = text

    def close(self) -> str:
        text = self.tok.decode(self.ids)
        if text.startswith(self.emitted):
            self.out.write(text[len(self.emitted):])
        self.out.flush()
        self.emitted = text
        return text


# ---- generation -----------------------------------------------------------------------------
def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 vocab_limit: int | None = None, eos_id: int | None = None,
                 on_token=None) -> list[int]:
    """Generate up to ``max_new_tokens`` ids after ``prompt_ids`` (batch 1); stops after EOS.

    ``on_token(id)`` is called for each new id as soon as it is sampled.
    """
    from nsa_jax.decode import Decoder

    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    out: list[int] = []
    if max_new_tokens <= 0:
        return out
    dec = Decoder(model, batch=1, max_len=len(prompt_ids) + max_new_tokens)
    logits = dec.prefill(jnp.asarray([prompt_ids], jnp.int32))
    key = jax.random.PRNGKey(seed)
    for i in range(max_new_tokens):
        key, sub = jax.random.split(key)
        tok = int(sample(logits, sub, temperature=float(temperature), top_k=int(top_k),
                         top_p=float(top_p), vocab_limit=vocab_limit)[0])
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if tok == eos_id or i == max_new_tokens - 1:
            break
        logits = dec.step(jnp.asarray([tok], jnp.int32))
    return out


# ---- command line ---------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m nsa_jax.generate",
                description="Generate text from a trained run (NSA or dense) with KV caches.")
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR",
                   help="training run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--step", type=int, default=None,
                   help="checkpoint step to load (default: the newest)")
    p.add_argument("--prompt", default="", help="prompt text (default: start from EOS)")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="sampling temperature; 0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="keep the K most likely tokens; 0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling: keep the most likely tokens up to mass P; 1 = off")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--debug", action="store_true", help="show tracebacks with errors")
    return p


def _check_args(a) -> str | None:
    if a.max_new_tokens < 1:
        return f"--max-new-tokens: must be >= 1, got {a.max_new_tokens}"
    if not a.temperature >= 0:
        return f"--temperature: must be >= 0, got {a.temperature}"
    if a.top_k < 0:
        return f"--top-k: must be >= 0 (0 = off), got {a.top_k}"
    if not 0 < a.top_p <= 1:
        return f"--top-p: must be in (0, 1], got {a.top_p}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)

    def report(msg: str, status: int) -> int:
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(f"error: {msg}\n")
        sys.stderr.flush()
        return status

    bad = _check_args(args)
    if bad:
        return report(bad, EXIT_BAD_INPUT)

    try:  # orbax logs read-only-manager notices through absl; they are not for this CLI's user
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover
        pass

    from nsa_jax.config import ConfigError
    from nsa_jax.data import DataError, get_tokenizer
    from nsa_jax.decode import DecodeError
    from nsa_jax.train.inference import restore_for_inference
    from nsa_jax.train.errors import TrainError, one_line

    try:
        cfg, model, step = restore_for_inference(args.checkpoint, step=args.step)
        tok = get_tokenizer(cfg.data.tokenizer)
        if tok.vocab_size > cfg.model.vocab_size:
            raise ConfigError(f"data.tokenizer: {cfg.data.tokenizer!r} has {tok.vocab_size} "
                              f"tokens but the model's vocab_size is {cfg.model.vocab_size}")
        prompt_ids = tok.encode(args.prompt) if args.prompt else [tok.eos_id]
        sys.stderr.write(f"loaded {args.checkpoint} step {step} ({cfg.name}, attention="
                         f"{cfg.model.attention}) | prompt {len(prompt_ids)} tokens\n")
        sys.stderr.flush()
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
        stream = TextStream(tok, sys.stdout)
        t0 = time.perf_counter()
        ids = generate_ids(model, prompt_ids, args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           seed=args.seed, vocab_limit=tok.vocab_size, eos_id=tok.eos_id,
                           on_token=lambda i: i != tok.eos_id and stream.push(i))
        stream.close()
        dt = time.perf_counter() - t0
        sys.stdout.write("\n")
        sys.stdout.flush()
        sys.stderr.write(f"generated {len(ids)} tokens in {dt:.2f}s (incl. compilation)\n")
        return 0
    except (ConfigError, DataError, TrainError, DecodeError) as e:
        return report(one_line(e), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
