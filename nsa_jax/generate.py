"""``python -m nsa_jax.generate``: sample text from a trained run with NSA KV caches.

    python -m nsa_jax.generate --checkpoint RUN_DIR [--prompt TEXT ... | --prompts-file FILE]
        [--max-new-tokens N] [--max-len N] [--memory-limit GIB] [--temperature T] [--top-k K]
        [--top-p P] [--seed S] [--step STEP]

Loads the run (:func:`nsa_jax.inference.load_run`: ``config.yaml``, the newest usable checkpoint,
the tokenizer ``data.tokenizer``) and generates every prompt in one batch
(:func:`generate_batch`): prompts are right-padded to a bucketed width and prefilled with the
parallel (training-kernel) forward, in row groups when the whole batch does not fit in memory,
then decoded one token per step for all rows (:mod:`nsa_jax.decode`). A row stops at EOS (not
printed) or after N tokens. With one prompt the text streams to stdout after the echoed
prompt; with several, each completion is printed when its row is done, under a line
``=== prompt I ===`` (I counts prompts from 0). An empty prompt starts from the EOS token.
Temperature 0 is greedy decoding. Timings go to stderr at the end: prefill and decode tokens/s,
both without compilation.

The context is ``--max-len`` tokens per row (prompt + new), by default the run's
``data.seq_len``. Bad input (arguments, an empty prompts file, a prompt longer than the context,
prompt + new tokens past it, caches or prefill too large for memory, a missing or incompatible
checkpoint, an unknown tokenizer) prints one line ``error: ...`` naming the argument on stderr,
writes nothing to stdout and exits with status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
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


# ---- requests -------------------------------------------------------------------------------
# RoPE angles are computed from float32 positions (nsa_jax.nsa.rope), which are exact integers
# only up to 2**24: past that, neighbouring positions get the same rotation.
HARD_MAX_LEN = 1 << 24
GiB = 1 << 30


class RequestError(ValueError):
    """A generation request that cannot run (context, cache or memory); ``arg`` names the
    argument at fault (``prompts``, ``max_new_tokens``, ``max_len``, ``memory_limit``).

    ``detail`` may name other arguments as ``{max_len}``-style fields: :meth:`message` fills
    them with the caller's names (Python keywords by default, or the CLI's flags)."""

    def __init__(self, arg: str, detail: str):
        self.arg, self.detail = arg, detail
        super().__init__(self.message())

    def message(self, names: dict[str, str] | None = None) -> str:
        names = {k: k for k in ("prompts", "max_new_tokens", "max_len", "memory_limit")} | (
            names or {})
        return f"{names[self.arg]}: {self.detail.format(**names)}"


def bucket(n: int) -> int:
    """Padded width for n tokens: a multiple of 64 and of 1/8 of the next power of two, so
    prompt widths (and cache lengths) fall into a few shapes per octave (< 25% padding above
    512 tokens) and a new length rarely recompiles."""
    n = max(int(n), 1)
    step = max(64, 1 << max(0, (n - 1).bit_length() - 3))
    return -(-n // step) * step


def _gib(n: int) -> str:
    """Bytes in binary units, e.g. ``1.50 GiB``, ``12.0 MiB``."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n} B"


def _mem_available() -> int | None:
    """Host RAM available (``MemAvailable`` in /proc/meminfo), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_memory(model, memory_limit: int | None = None) -> int | None:
    """Bytes available for the KV caches and the prefill workspace, before a Decoder exists.

    On a device reporting memory stats (GPU): its ``bytes_limit - bytes_in_use`` (the weights are
    already loaded) less the compute-dtype copy of the weights a Decoder makes. Elsewhere (CPU):
    the host's available RAM less that copy. ``memory_limit`` (bytes for weights + caches +
    prefill; the CLI's ``--memory-limit``) caps either. None: unknown, no check."""
    import numpy as np
    from flax import nnx

    weights = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
    copy = 0 if model.dtype == jnp.float32 else weights * np.dtype(model.dtype).itemsize // 4
    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0) - copy
    else:
        avail = _mem_available()
        free = None if avail is None else avail - copy
    if memory_limit is not None:
        mine = memory_limit - weights - copy
        free = mine if free is None else min(free, mine)
    return free


@dataclasses.dataclass
class Timing:
    """Where a :func:`generate_batch` call spent its time (seconds, wall clock).

    prefill_s excludes compilation (``prefill_compile_s``: the prefill is compiled ahead of time,
    including any group sizes tried for memory). The first decode iteration (sampling the first
    new tokens + the first step) compiles the step and the sampler: it is timed apart
    (``first_step_s``), and ``decode_s`` / ``decode_tokens`` cover the iterations after it.
    """
    rows: int = 0
    width: int = 0
    cache_len: int = 0
    rows_per_group: int = 0
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    prefill_compile_s: float = 0.0
    first_step_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    kept_tokens: int = 0

    def lines(self) -> list[str]:
        groups = -(-self.rows // max(self.rows_per_group, 1))
        out = [f"prefill: {self.prompt_tokens} prompt tokens, {self.rows} row(s) padded to "
               f"{self.width} ({groups} group(s) of <= {self.rows_per_group} rows), in "
               f"{self.prefill_s:.3f}s = {self.prompt_tokens / max(self.prefill_s, 1e-9):.1f} "
               f"tok/s (compilation {self.prefill_compile_s:.2f}s excluded)"]
        if self.decode_tokens:
            out.append(f"decode: {self.decode_tokens} tokens ({self.rows} row(s) x "
                       f"{self.decode_tokens // self.rows} steps) in {self.decode_s:.3f}s = "
                       f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tok/s (first step "
                       f"{self.first_step_s:.2f}s, which compiles, excluded); "
                       f"{self.kept_tokens} tokens kept before EOS")
        else:
            out.append(f"decode: no timed steps (first step {self.first_step_s:.2f}s incl. "
                       f"compilation); {self.kept_tokens} tokens kept")
        return out


# ---- generation -----------------------------------------------------------------------------
def _check_request(prompts, max_new_tokens: int, max_len: int) -> None:
    if not prompts:
        raise RequestError("prompts", "no prompts given")
    if not 1 <= max_len <= HARD_MAX_LEN:
        raise RequestError("max_len", f"must be in [1, {HARD_MAX_LEN}] (RoPE positions are "
                                      f"exact in float32 up to 2**24), got {max_len}")
    if max_new_tokens < 1:
        raise RequestError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if len(p) < 1:
            raise RequestError("prompts", f"prompt {i} holds no tokens")
        if len(p) > max_len:
            raise RequestError("prompts", f"prompt {i} has {len(p)} tokens, more than the "
                                          f"context {{max_len}}={max_len}")
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    n = len(prompts[longest])
    if n + max_new_tokens > max_len:
        raise RequestError("max_new_tokens", f"prompt {longest} ({n} tokens) + {max_new_tokens} "
                                             f"new tokens exceed the context {{max_len}}="
                                             f"{max_len}; at most {max_len - n} new tokens fit")


def _check_memory(model, prompts, cache_len: int, free: int | None) -> None:
    """Refuse before allocating when the batch's KV caches do not fit in ``free`` bytes."""
    from nsa_jax.decode import cache_bytes, init_cache

    if free is None:
        return

    def cache_for(rows, length):
        return cache_bytes(jax.eval_shape(lambda: init_cache(model, rows, length)))

    B, longest = len(prompts), max(len(p) for p in prompts)
    row, prompt_only = cache_for(1, cache_len), cache_for(1, min(bucket(longest), cache_len))
    if prompt_only > free:
        raise RequestError("prompts", f"a prompt of {longest} tokens needs a "
                                      f"{_gib(prompt_only)} KV cache, more than the "
                                      f"{_gib(max(free, 0))} free")
    if row > free:
        raise RequestError("max_new_tokens", f"one row of {cache_len} tokens (prompt + new) "
                                             f"needs a {_gib(row)} KV cache, more than the "
                                             f"{_gib(max(free, 0))} free")
    if B * row > free:
        raise RequestError("prompts", f"{B} prompts need {_gib(B * row)} of KV cache at "
                                      f"{cache_len} tokens per row, {_gib(free)} free: at "
                                      f"most {free // row} prompts fit")


def _rows_per_group(dec, width: int, free: int | None, longest: int) -> int:
    """The most rows (B, B/2, ..., 1) whose prefill fits in what the caches leave free."""
    from nsa_jax.decode import cache_bytes

    g = dec.batch
    if free is None:
        return g
    left = free - cache_bytes(dec.cache)
    while True:
        need = dec.prefill_bytes(g, width)
        if need is None or need <= left:
            return g
        if g == 1:
            raise RequestError("prompts", f"prefilling a prompt of {longest} tokens (padded to "
                                          f"{width}) needs {_gib(need)}, more than the "
                                          f"{_gib(max(left, 0))} the KV caches leave free")
        g = -(-g // 2)


def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, *,
                   temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                   vocab_limit: int | None = None, eos_id: int | None = None,
                   max_len: int | None = None, memory_limit: int | None = None,
                   rows_per_group: int | None = None, on_token=None, on_done=None,
                   timing: Timing | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` ids after each prompt (lists of ids, any lengths), all
    rows in one batch; returns each row's new ids (ending with EOS when it was sampled).

    Prompts are right-padded to :func:`bucket` of the longest and prefilled with the parallel
    (training-kernel) forward, in row groups of ``rows_per_group`` (default: as many as fit in
    memory); then one jitted step per token for all rows. A row that samples ``eos_id`` is done:
    it keeps stepping with the batch but its tokens are discarded. One PRNG key per step is
    split from ``seed`` and drawn over all rows (batch 1 reproduces :func:`generate_ids`).

    ``max_len``: the context, tokens per row (prompt + new); default prompt + new (at most
    :data:`HARD_MAX_LEN`). The cache holds :func:`bucket` (longest prompt + new) tokens, capped
    at ``max_len``. Requests that cannot run raise :class:`RequestError` before any cache is
    allocated or prefill runs (memory: :func:`free_memory` with ``memory_limit``).

    ``on_token(row, id)`` is called for every kept id as soon as it is sampled, ``on_done(row,
    ids)`` once per row when it finishes; ``timing`` (a :class:`Timing`) is filled in.
    """
    import numpy as np
    from nsa_jax.decode import Decoder

    prompts = [list(map(int, p)) for p in prompts]
    longest = max((len(p) for p in prompts), default=0)
    if max_len is None:
        max_len = min(longest + max(max_new_tokens, 0), HARD_MAX_LEN)
    _check_request(prompts, max_new_tokens, max_len)
    B = len(prompts)
    cache_len = min(bucket(longest + max_new_tokens), max_len)
    width = min(bucket(longest), cache_len)
    free = free_memory(model, memory_limit)
    _check_memory(model, prompts, cache_len, free)

    dec = Decoder(model, batch=B, max_len=cache_len)
    g = (min(max(int(rows_per_group), 1), B) if rows_per_group
         else _rows_per_group(dec, width, free, longest))
    tokens = np.zeros((B, width), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    lengths = [len(p) for p in prompts]
    t = timing if timing is not None else Timing()
    t.rows, t.width, t.cache_len, t.rows_per_group = B, width, cache_len, g
    t.prompt_tokens = sum(lengths)

    compile0, t0 = dec.compile_s, time.perf_counter()     # group sizes tried: compiled already
    parts = []
    for s in range(0, B, g):
        rows = list(range(s, min(s + g, B)))
        parts.append(dec.prefill_rows(rows, tokens[rows[0]:rows[-1] + 1],
                                      lengths[rows[0]:rows[-1] + 1]))
    logits = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)
    logits.block_until_ready()
    t.prefill_s = time.perf_counter() - t0 - (dec.compile_s - compile0)
    t.prefill_compile_s = dec.compile_s

    out: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    key = jax.random.PRNGKey(seed)
    for i in range(max_new_tokens):
        t1 = time.perf_counter()
        key, sub = jax.random.split(key)
        toks = sample(logits, sub, temperature=float(temperature), top_k=int(top_k),
                      top_p=float(top_p), vocab_limit=vocab_limit)
        host = np.asarray(toks)
        for b in range(B):
            if done[b]:
                continue
            tok = int(host[b])
            out[b].append(tok)
            if on_token is not None:
                on_token(b, tok)
            if tok == eos_id or i == max_new_tokens - 1:
                done[b] = True
                if on_done is not None:
                    on_done(b, out[b])
        if not all(done):
            logits = dec.step(toks)
            logits.block_until_ready()
        dt = time.perf_counter() - t1
        if i == 0:
            t.first_step_s = dt
        else:
            t.decode_s += dt
            t.decode_tokens += B
        if all(done):
            break
    t.kept_tokens = sum(len(o) for o in out)
    return out


def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 vocab_limit: int | None = None, eos_id: int | None = None,
                 on_token=None) -> list[int]:
    """Generate up to ``max_new_tokens`` ids after ``prompt_ids`` (batch 1); stops after EOS.

    ``on_token(id)`` is called for each new id as soon as it is sampled.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    if max_new_tokens <= 0:
        return []
    cb = None if on_token is None else (lambda _, i: on_token(i))
    return generate_batch(model, [prompt_ids], max_new_tokens, temperature=temperature,
                          top_k=top_k, top_p=top_p, seed=seed, vocab_limit=vocab_limit,
                          eos_id=eos_id, on_token=cb)[0]


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
    p.add_argument("--debug", action="store_true", help="show tracebacks with errors")
    return p


def _check_args(a) -> str | None:
    if a.max_new_tokens < 1:
        return f"--max-new-tokens: must be >= 1, got {a.max_new_tokens}"
    if a.max_len is not None and not 1 <= a.max_len <= HARD_MAX_LEN:
        return (f"--max-len: must be in [1, {HARD_MAX_LEN}] (RoPE positions are exact in "
                f"float32 up to 2**24), got {a.max_len}")
    if a.memory_limit is not None and not a.memory_limit > 0:
        return f"--memory-limit: must be > 0 GiB, got {a.memory_limit}"
    if not a.temperature >= 0:
        return f"--temperature: must be >= 0, got {a.temperature}"
    if a.top_k < 0:
        return f"--top-k: must be >= 0 (0 = off), got {a.top_k}"
    if not 0 < a.top_p <= 1:
        return f"--top-p: must be in (0, 1], got {a.top_p}"
    return None


def read_prompts(path: str) -> list[str]:
    """Non-blank lines of a UTF-8 file (line ends stripped); ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise ValueError(f"--prompts-file: cannot read {path} ({reason})") from None
    prompts = [line for line in text.splitlines() if line.strip()]
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
    try:
        prompts = read_prompts(args.prompts_file) if args.prompts_file else (args.prompt or [""])
    except ValueError as e:
        return report(str(e), EXIT_BAD_INPUT)

    try:  # orbax logs read-only-manager notices through absl; they are not for this CLI's user
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover
        pass

    from nsa_jax.config import ConfigError
    from nsa_jax.data import DataError
    from nsa_jax.decode import DecodeError
    from nsa_jax.inference import load_run
    from nsa_jax.train.errors import TrainError, one_line

    names = {"prompts": "--prompts-file" if args.prompts_file else "--prompt",
             "max_new_tokens": "--max-new-tokens", "max_len": "--max-len",
             "memory_limit": "--memory-limit"}
    try:
        run = load_run(args.checkpoint, step=args.step)
        printer = _Printer(run, prompts, sys.stdout)
        timing = Timing()
        limit = None if args.memory_limit is None else int(args.memory_limit * GiB)
        ids = run.generate_ids([run.encode(p) for p in prompts], args.max_new_tokens,
                               temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed, max_len=args.max_len,
                               memory_limit=limit, on_token=printer.on_token,
                               on_done=printer.on_done, timing=timing)
        sys.stderr.write(f"{args.checkpoint}: {run.cfg.name}, attention="
                         f"{run.cfg.model.attention}, step {run.step}; {len(ids)} prompt(s), "
                         f"context {args.max_len or run.context}, cache {timing.cache_len} "
                         f"tokens per row\n")
        for line in timing.lines():
            sys.stderr.write(line + "\n")
        return 0
    except RequestError as e:
        return report(e.message(names), EXIT_BAD_INPUT)
    except (ConfigError, DataError, TrainError, DecodeError) as e:
        return report(one_line(e), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130


if __name__ == "__main__":   # run the importable module's main: one RequestError class
    from nsa_jax.generate import main as _main
    raise SystemExit(_main())
