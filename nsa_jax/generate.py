"""Batched generation with NSA KV caches: :func:`generate_batch` (and :func:`generate_ids`, one
prompt). The command line ``python -m nsa_jax.generate`` is :mod:`nsa_jax.generate_cli`;
sampling is :mod:`nsa_jax.sampling`, the request's limits :mod:`nsa_jax.request`."""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from nsa_jax.request import (GiB, HARD_MAX_LEN, RequestError, bucket, check_chunk,  # noqa: F401
                             check_decode, check_memory, check_request, check_sampling,
                             fit_prefill, fit_rows, free_memory)
from nsa_jax.sampling import filter_logits, sample  # noqa: F401

_CLI = ("main", "build_parser", "read_prompts", "TextStream")


def __getattr__(name):   # the CLI's names, imported on use (it imports this module)
    if name in _CLI:
        from nsa_jax import generate_cli
        return getattr(generate_cli, name)
    raise AttributeError(f"module 'nsa_jax.generate' has no attribute {name!r}")


@dataclasses.dataclass
class Timing:
    """Where a :func:`generate_batch` call spent its time (seconds, wall clock).

    prefill_s excludes compilation (``prefill_compile_s``: the prefill is compiled ahead of time,
    including any group sizes tried for memory). Decoding runs in calls of up to
    ``steps_per_call`` tokens per row (:meth:`nsa_jax.decode.Decoder.decode`: sampling and model
    steps in one jitted call). The first call (``first_steps`` tokens per row) compiles: it is
    timed apart (``first_step_s``, including its compilation, the copy of its ids to the host
    and the callbacks; ``first_compile_s`` of it compiling). ``decode_s`` covers the calls after
    it, each timed from its issue until its ids are on the host and passed to the callbacks,
    without the compilation of a shorter last call (``decode_compile_s``); ``decode_tokens``
    counts the tokens those calls sampled, over all rows (rows already done included: they step
    with the batch). A generation of one call reports that call's rate without its compilation
    instead, marked as such: it still holds the first run's set-up, so it understates the rate.
    Decode calls compiled ahead by the memory check (before the prefill: :func:`nsa_jax.request.
    check_decode`) are charged their compile seconds as if they had compiled in their first call
    (``first_step_s`` and ``first_compile_s``, or ``decode_compile_s``; a call that never runs,
    EOS having ended every row, to ``decode_compile_s``), not to the prefill.
    """
    rows: int = 0
    width: int = 0
    cache_len: int = 0
    rows_per_group: int = 0
    chunk: int = 0
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    prefill_compile_s: float = 0.0
    steps_per_call: int = 0
    first_steps: int = 0
    first_step_s: float = 0.0
    first_compile_s: float = 0.0
    decode_compile_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    kept_tokens: int = 0

    def lines(self) -> list[str]:
        groups = -(-self.rows // max(self.rows_per_group, 1))
        chunks = f" in chunks of {self.chunk} tokens" if self.chunk else ""
        out = [f"prefill: {self.prompt_tokens} prompt tokens, {self.rows} row(s) padded to "
               f"{self.width} ({groups} group(s) of <= {self.rows_per_group} rows{chunks}), in "
               f"{self.prefill_s:.3f}s = {self.prompt_tokens / max(self.prefill_s, 1e-9):.1f} "
               f"tok/s (compilation {self.prefill_compile_s:.2f}s excluded)"]
        first = (f"first call of {self.first_steps} step(s) {self.first_step_s:.2f}s, which "
                 f"compiles")
        if self.decode_tokens:
            comp = (f", and {self.decode_compile_s:.2f}s compiling a shorter last call"
                    if self.decode_compile_s else "")
            out.append(f"decode: {self.decode_tokens} tokens ({self.rows} row(s) x "
                       f"{self.decode_tokens // self.rows} steps, <= {self.steps_per_call} per "
                       f"call) in {self.decode_s:.3f}s = "
                       f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tok/s ({first}"
                       f"{comp}, excluded); {self.kept_tokens} tokens kept before EOS")
        elif self.first_steps:
            run_s = max(self.first_step_s - self.first_compile_s, 1e-9)
            tokens = self.rows * self.first_steps
            out.append(f"decode: {tokens} tokens ({self.rows} row(s) x {self.first_steps} steps, "
                       f"one call) in {run_s:.3f}s = {tokens / run_s:.1f} tok/s, from the first "
                       f"call alone (its compilation {self.first_compile_s:.2f}s excluded, its "
                       f"first-run set-up not: a lower bound); {self.kept_tokens} tokens kept "
                       f"before EOS")
        else:
            out.append(f"decode: no steps; {self.kept_tokens} tokens kept")
        return out



def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, *,
                   temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                   vocab_limit: int | None = None, eos_id: int | None = None,
                   max_len: int | None = None, memory_limit: int | None = None,
                   rows_per_group: int | None = None, prefill_chunk: int | None = None,
                   steps_per_call: int = 16, on_token=None, on_done=None,
                   timing: Timing | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` ids after each prompt (lists of ids, any lengths), all
    rows in one batch; returns each row's new ids (ending with EOS when it was sampled).

    Prompts are right-padded to :func:`bucket` of the longest and prefilled with the parallel
    (training-kernel) forward, in row groups of ``rows_per_group`` (default: as many as fit in
    memory); where not even one row's prefill fits at once, one row at a time in chunks
    (``prefill_chunk`` tokens, default the largest that fits: :func:`nsa_jax.request.
    fit_prefill`; each chunk after the first attends over the cache the earlier ones filled,
    :mod:`nsa_jax.nsa.chunked`). Then all rows decode together, ``steps_per_call`` tokens per
    jitted call (:meth:`nsa_jax.decode.Decoder.decode`; the last call is shortened to the tokens
    left, so at most two call lengths compile). A row that samples ``eos_id`` is done: it keeps
    stepping with the batch but its tokens are discarded; decoding stops after the call in which every
    row is done. One PRNG key per token is split from ``seed`` and drawn over all rows (batch 1
    reproduces :func:`generate_ids`). The ids do not depend on ``steps_per_call`` (the key
    sequence and the sampling math are the same; see :func:`nsa_jax.decode_loop.decode_loop_jit`
    on the logits of a step compiled inside the loop); larger calls pay the per-call host cost
    less often, smaller ones hand ids to the callbacks sooner.

    ``max_len``: the context, tokens per row (prompt + new); default prompt + new (at most
    :data:`HARD_MAX_LEN`). The cache holds :func:`bucket` (longest prompt + new) tokens, capped
    at ``max_len``. Requests that cannot run raise :class:`RequestError` before any cache is
    allocated or prefill runs (memory: :func:`free_memory` with ``memory_limit``, in bytes,
    against the KV caches, the prefill and the decode calls, :func:`nsa_jax.request.
    check_decode`; sampling: :func:`nsa_jax.request.check_sampling`).

    ``on_token(row, id)`` is called for every kept id, in token order (rows in order within a
    token), as soon as the call that sampled it returns; ``on_done(row, ids)`` once per row when
    it finishes; ``timing`` (a :class:`Timing`) is filled in.

    The last call does not feed its last ids to the model (they are never needed), so the model
    steps ``max_new_tokens - 1`` times at most, as a per-token loop does, and the positions
    written stay below longest prompt + ``max_new_tokens`` <= the cache length.
    """
    import numpy as np
    from nsa_jax.decode import Decoder, chunk_unit

    prompts = [list(map(int, p)) for p in prompts]
    longest = max((len(p) for p in prompts), default=0)
    if max_len is None:
        max_len = min(longest + max(max_new_tokens, 0), HARD_MAX_LEN)
    check_request(prompts, max_new_tokens, max_len)
    check_sampling(temperature, top_k, top_p, seed, steps_per_call)
    check_chunk(prefill_chunk, chunk_unit(model))
    k = int(steps_per_call)
    B = len(prompts)
    cache_len = min(bucket(longest + max_new_tokens), max_len)
    width = min(bucket(longest), cache_len)
    free = free_memory(model, memory_limit)
    check_memory(model, prompts, cache_len, free)
    dec = Decoder(model, batch=B, max_len=cache_len)
    chunk = None if prefill_chunk is None or prefill_chunk >= width else int(prefill_chunk)
    if rows_per_group:
        g = min(max(int(rows_per_group), 1), B)
    else:
        g, chunk = fit_prefill(dec, width, free, longest, chunk)
    ahead = check_decode(dec, max_new_tokens, k, free, temperature=temperature, top_k=top_k,
                         top_p=top_p, vocab_limit=vocab_limit, eos_id=eos_id)
    tokens = np.zeros((B, width), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    lengths = [len(p) for p in prompts]
    t = timing if timing is not None else Timing()
    t.rows, t.width, t.cache_len, t.rows_per_group = B, width, cache_len, g
    t.chunk = chunk or 0
    t.steps_per_call = k
    t.prompt_tokens = sum(lengths)

    compile0, t0 = dec.compile_s, time.perf_counter()     # group sizes tried: compiled already
    parts = []
    for s in range(0, B, g):
        rows = list(range(s, min(s + g, B)))
        parts.append(dec.prefill_rows(rows, tokens[rows[0]:rows[-1] + 1],
                                      lengths[rows[0]:rows[-1] + 1], chunk=chunk))
    logits = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)
    del parts                   # the groups' logits: not held beside the decode calls' own
    logits.block_until_ready()
    t.prefill_s = time.perf_counter() - t0 - (dec.compile_s - compile0)
    t.prefill_compile_s = dec.compile_s - sum(ahead.values())

    out: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    key = jax.random.PRNGKey(seed)
    row_done = None                       # the device's copy of ``done`` (EOS only)
    i = 0                                 # tokens sampled per row so far
    while i < max_new_tokens and not all(done):
        n = min(k, max_new_tokens - i)
        last = i + n == max_new_tokens
        t1, compile1 = time.perf_counter(), dec.compile_s
        ids, logits, key, row_done = dec.decode(
            logits, n, key, temperature=temperature, top_k=top_k, top_p=top_p,
            vocab_limit=vocab_limit, eos_id=eos_id, done=row_done, feed_last=not last)
        host = np.asarray(ids)
        jax.block_until_ready(logits)
        for j in range(n):
            for b in range(B):
                if done[b]:
                    continue
                tok = int(host[b, j])
                out[b].append(tok)
                if on_token is not None:
                    on_token(b, tok)
                if tok == eos_id or i + j == max_new_tokens - 1:
                    done[b] = True
                    if on_done is not None:
                        on_done(b, out[b])
        dt = time.perf_counter() - t1
        compile_s = dec.compile_s - compile1
        early = ahead.pop((n, not last), 0.0)       # compiled by check_decode, before prefill
        if i == 0:
            t.first_steps, t.first_step_s = n, dt + early
            t.first_compile_s = compile_s + early
        else:
            t.decode_compile_s += compile_s + early
            t.decode_s += dt - compile_s
            t.decode_tokens += B * n
        i += n
    t.decode_compile_s += sum(ahead.values())     # compiled ahead for calls an EOS made moot
    t.kept_tokens = sum(len(o) for o in out)
    return out


def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 vocab_limit: int | None = None, eos_id: int | None = None,
                 steps_per_call: int = 16, on_token=None) -> list[int]:
    """Generate up to ``max_new_tokens`` ids after ``prompt_ids`` (batch 1); stops after EOS.

    ``on_token(id)`` is called for each new id as soon as it is sampled. A request that cannot
    run (an empty prompt, ``max_new_tokens`` < 1, ...) raises :class:`RequestError` naming the
    argument, as :func:`generate_batch` does.
    """
    cb = None if on_token is None else (lambda _, i: on_token(i))
    return generate_batch(model, [prompt_ids], max_new_tokens, temperature=temperature,
                          top_k=top_k, top_p=top_p, seed=seed, vocab_limit=vocab_limit,
                          eos_id=eos_id, steps_per_call=steps_per_call, on_token=cb)[0]


if __name__ == "__main__":   # python -m nsa_jax.generate
    from nsa_jax.generate_cli import exit_process, main as _main
    exit_process(_main())
