"""``python -m nsa_jax.generate``: sample text from a trained run with NSA KV caches.

    python -m nsa_jax.generate --checkpoint RUN_DIR [--prompt TEXT ... | --prompts-file FILE]
        [--max-new-tokens N] [--max-len N] [--memory-limit GIB] [--temperature T] [--top-k K]
        [--top-p P] [--seed S] [--steps-per-call N] [--prefill-chunk N] [--step STEP]
        [--compile-cache DIR]

Loads the run (:func:`nsa_jax.inference.load_run`: ``config.yaml``, the newest usable checkpoint,
the tokenizer ``data.tokenizer``) and generates every prompt in one batch
(:func:`nsa_jax.generate.generate_batch`): prompts are right-padded to a bucketed width and prefilled with the
parallel (training-kernel) forward, in row groups when the whole batch does not fit in memory
and in chunks when one prompt does not (``--prefill-chunk`` forces a chunk length),
then decoded for all rows, ``--steps-per-call`` tokens per jitted call (sampling and model
steps in one call, :meth:`nsa_jax.decode.Decoder.decode`; it splits the work into calls and
does not change the sampling). A row stops at EOS (not printed) or after N tokens. With one
prompt the text streams to stdout after the echoed prompt, a call's tokens at a time; with several,
each completion is printed when its row is done, under a line ``=== prompt I ===`` (I counts
prompts from 0). An empty prompt starts from the EOS token. Temperature 0 is greedy decoding.
Timings go to stderr at the end: prefill and decode tokens/s, both without compilation (decode:
the calls after the first, see :class:`nsa_jax.generate.Timing`).

The context is ``--max-len`` tokens per row (prompt + new), by default the run's
``data.seq_len``. Bad input (arguments, an empty prompts file, a prompt longer than the context,
prompt + new tokens past it, caches or prefill too large for memory, a missing or incompatible
checkpoint, an unknown tokenizer, a ``--compile-cache`` that cannot be a writable directory)
prints one line ``error: ...`` naming the argument on stderr, writes nothing to stdout and
exits with status 2. When stdout's reader goes away (``... | head``) it stops generating and
exits with status 1, without a message (:mod:`nsa_jax.streams`). A stdout whose encoding
cannot encode some of the text
(``PYTHONIOENCODING=cp1252``, a Windows console, ``LANG=C``) gets those characters as backslash
escapes, as Python writes them on stderr, and one ``warning:`` line says so
(:class:`EncodableOutput`): the text is never lost to a ``UnicodeEncodeError``.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import math
import os
import sys

from nsa_jax.errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, OneLineParser,
                            one_line, parse_args, report, warn)
from nsa_jax.generate import Timing
from nsa_jax.request import GiB, HARD_MAX_LEN, RequestError, check_sampling
from nsa_jax.streams import to_devnull


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


class EncodableOutput:
    """``out`` for the generated text, where ``out``'s encoding may not cover it
    (``PYTHONIOENCODING=cp1252``, a Windows console, ``LANG=C``): a character it cannot encode
    is written as a backslash escape (``\\u6f22``; errors="backslashreplace", what Python's
    stderr does) instead of ending the run with ``UnicodeEncodeError`` and losing the text.
    :meth:`note` then warns once on stderr, naming the encoding. A stream with an error handler
    of its own (``PYTHONIOENCODING=cp1252:replace``) is left to it."""

    def __init__(self, out):
        self.out = out
        self.encoding = getattr(out, "encoding", None) or "utf-8"
        self.replaced, self.example, self._noted = 0, "", False
        try:
            codecs.lookup(self.encoding)
            self._check = getattr(out, "errors", None) in (None, "strict")
        except LookupError:
            self._check = False

    def write(self, text: str) -> int:
        if self._check:
            try:
                text.encode(self.encoding)
            except UnicodeEncodeError:
                text = self._escape(text)
        return self.out.write(text)

    def _escape(self, text: str) -> str:
        """``text`` with every character the encoding cannot encode escaped (and counted)."""
        bad = [c for c in text if not _encodes(c, self.encoding)]
        self.replaced += len(bad)
        if bad and not self.example:
            self.example = f"{bad[0]!a}"[1:-1]
        return text.encode(self.encoding, "backslashreplace").decode(self.encoding)

    def flush(self) -> None:
        self.out.flush()

    def note(self) -> None:
        """One ``warning:`` line on stderr if characters were escaped (once per stream)."""
        if self.replaced and not self._noted:
            self._noted = True
            warn(f"stdout's encoding {self.encoding} cannot encode {self.replaced} character(s) "
                 f"of the text; they were written as backslash escapes (e.g. {self.example}); "
                 f"set PYTHONIOENCODING=utf-8 to get them as text")

    def __getattr__(self, name):     # fileno, isatty, ...: the wrapped stream's
        return getattr(self.out, name)


def _encodes(c: str, encoding: str) -> bool:
    try:
        c.encode(encoding)
        return True
    except UnicodeEncodeError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m nsa_jax.generate",
                      description="Generate text from a trained run (NSA or dense) with KV caches.")
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR",
                   help="training run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--step", type=int, default=None,
                   help="checkpoint step to load (default: the newest usable)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                     help="prompt text; repeat for a batch (default: one prompt starting from "
                          "EOS)")
    src.add_argument("--prompts-file", default=None, metavar="FILE",
                     help="UTF-8 text file, one prompt per line (blank lines skipped), all "
                          "generated in one batch")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N",
                   help="new tokens per prompt (default 100)")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="the context: prompt + new tokens per row (default: the run's "
                        f"data.seq_len; at most {HARD_MAX_LEN})")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                   help="memory for weights + KV caches + prefill, in GiB (default: the "
                        "device's free memory, on CPU the host's available RAM)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="sampling temperature; 0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="keep the K most likely tokens; 0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling: keep the most likely tokens up to mass P; 1 = off")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--steps-per-call", type=int, default=16, metavar="N",
                   help="tokens per row sampled in one jitted call (default 16): larger N pays "
                        "the per-call host cost less often (faster decoding), but text streams "
                        "N tokens at a time; 1 = one call per token. The sampling is the same")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill each prompt N tokens at a time (a multiple of nsa.sel_block, 64 "
                        "for dense; default: at once, or in the largest chunk that fits when a "
                        "prompt's prefill does not fit in memory at once)")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="keep compiled programs in DIR (JAX's persistent compilation cache, "
                        "created if missing): a later run with the same prompt widths, chunk "
                        "and batch reads them instead of compiling")
    p.add_argument("--debug", action="store_true", help="show tracebacks with errors")
    return p


NAMES = {"max_new_tokens": "--max-new-tokens", "max_len": "--max-len",
         "memory_limit": "--memory-limit", "steps_per_call": "--steps-per-call",
         "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed",
         "prefill_chunk": "--prefill-chunk"}


def _check_args(a) -> str | None:
    if a.max_new_tokens < 1:
        return f"--max-new-tokens: must be >= 1, got {a.max_new_tokens}"
    if a.max_len is not None and not 1 <= a.max_len <= HARD_MAX_LEN:
        return (f"--max-len: must be in [1, {HARD_MAX_LEN}] (RoPE positions are exact in "
                f"float32 up to 2**24), got {a.max_len}")
    if a.memory_limit is not None and not (math.isfinite(a.memory_limit) and a.memory_limit > 0):
        return f"--memory-limit: must be a finite number > 0 (GiB), got {a.memory_limit}"
    if a.prefill_chunk is not None and a.prefill_chunk < 1:   # its multiple: once the run is known
        return f"--prefill-chunk: must be a positive number of tokens, got {a.prefill_chunk}"
    try:                             # the Python API's own check, before the run is loaded
        check_sampling(a.temperature, a.top_k, a.top_p, a.seed, a.steps_per_call)
    except RequestError as e:
        return e.message(NAMES)
    return None


def read_prompts(path: str) -> list[str]:
    """Non-blank lines of a UTF-8 file (a byte-order mark and line ends stripped: only ``\n``
    ends a line, so characters that ``str.splitlines`` would also split at, such as U+2028,
    stay inside their prompt); ValueError naming the file."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise ValueError(f"--prompts-file: cannot read {path} ({reason})") from None
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts-file: {path} holds no prompts (one per line)")
    return prompts


class _Printer:
    """Streams one prompt's completion as it is sampled; with several prompts prints each
    completion, labelled, when its row is done. Nothing is written before the first token."""

    def __init__(self, run, prompts: list[str], out):
        self.run, self.prompts, self.out = run, prompts, out
        self.stream = None

    def on_token(self, row: int, tok: int) -> None:
        if len(self.prompts) > 1 or tok == self.run.tokenizer.eos_id:
            return
        if self.stream is None:
            self.out.write(self.prompts[0])
            self.stream = TextStream(self.run.tokenizer, self.out)
        self.stream.push(tok)

    def on_done(self, row: int, ids: list[int]) -> None:
        if len(self.prompts) == 1:
            if self.stream is None:
                self.out.write(self.prompts[0])
            else:
                self.stream.close()
            self.out.write("\n")
        else:
            self.out.write(f"=== prompt {row} ===\n{self.prompts[row]}"
                           f"{self.run.decode(ids)}\n")
        self.out.flush()


def main(argv: list[str] | None = None) -> int:
    args, status = parse_args(build_parser(), list(sys.argv[1:] if argv is None else argv))
    if args is None:
        return status
    bad = _check_args(args)
    if bad:
        return report(bad, EXIT_BAD_INPUT, args.debug)
    try:
        prompts = read_prompts(args.prompts_file) if args.prompts_file else (args.prompt or [""])
    except ValueError as e:
        return report(str(e), EXIT_BAD_INPUT, args.debug)

    try:  # orbax logs read-only-manager notices through absl; they are not for this CLI's user
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover
        pass

    from nsa_jax.config import ConfigError
    from nsa_jax.data import DataError
    from nsa_jax.decode import DecodeError
    from nsa_jax.inference import load_run
    from nsa_jax.train.errors import TrainError

    names = NAMES | {"prompts": "--prompts-file" if args.prompts_file else "--prompt"}
    printer, out = None, EncodableOutput(sys.stdout)
    try:
        if args.compile_cache is not None:
            from nsa_jax import compile_cache
            try:
                compile_cache.enable(args.compile_cache, key="--compile-cache")
            except compile_cache.CompileCacheError as e:
                return report(str(e), EXIT_BAD_INPUT, args.debug)
        run = load_run(args.checkpoint, step=args.step)
        printer = _Printer(run, prompts, out)
        timing = Timing()
        limit = None if args.memory_limit is None else int(args.memory_limit * GiB)
        ids = run.generate_ids([run.encode(p) for p in prompts], args.max_new_tokens,
                               temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed, max_len=args.max_len,
                               memory_limit=limit, steps_per_call=args.steps_per_call,
                               prefill_chunk=args.prefill_chunk,
                               on_token=printer.on_token,
                               on_done=printer.on_done, timing=timing)
        sys.stderr.write(f"{args.checkpoint}: {run.cfg.name}, attention="
                         f"{run.cfg.model.attention}, step {run.step}; {len(ids)} prompt(s), "
                         f"context {args.max_len or run.context}, cache {timing.cache_len} "
                         f"tokens per row\n")
        for line in timing.lines():
            sys.stderr.write(line + "\n")
        return EXIT_OK
    except RequestError as e:
        return report(e.message(names), EXIT_BAD_INPUT, args.debug)
    except (ConfigError, DataError, TrainError, DecodeError) as e:
        return report(one_line(e), EXIT_BAD_INPUT, args.debug)
    except KeyboardInterrupt:
        if printer is not None and printer.stream is not None:   # end the streamed line
            with contextlib.suppress(BrokenPipeError):
                sys.stdout.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:       # a reader is gone (``... | head``): stop, quietly
        to_devnull(sys.stdout)
        to_devnull(sys.stderr)
        return EXIT_FAILED
    finally:
        out.note()


def exit_process(status: int):
    """End the process with ``status``. After a Ctrl-C (``EXIT_INTERRUPTED``): the streams
    flushed, then ``os._exit``, skipping the interpreter's teardown: a Ctrl-C inside an XLA
    compile can leave jaxlib to crash with SIGSEGV at exit (``bench/sigint_generate.py`` on the
    CPU, jax 0.10.2: 2 of 6 interrupts before, 0 of 4 after; bench/NOTES.md, forty-sixth
    session)."""
    if status != EXIT_INTERRUPTED:
        raise SystemExit(status)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_process(main())
