"""What a generation request may ask: the context (:data:`HARD_MAX_LEN`), the KV caches, the
prefill workspace and the decode calls' own memory against free memory (:func:`free_memory`). A
request that cannot run raises :class:`RequestError` naming the argument, before any cache is
allocated or prefill runs."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from nsa_jax.decode_memory import cache_bytes
from nsa_jax.errors import byte_size as gib  # bytes in a message

# RoPE angles are computed from float32 positions (nsa_jax.nsa.rope), which are exact integers
# only up to 2**24: past that, neighbouring positions get the same rotation.
HARD_MAX_LEN = 1 << 24
GiB = 1 << 30


ARGS = ("prompts", "max_new_tokens", "max_len", "memory_limit", "steps_per_call", "temperature",
        "top_k", "top_p", "seed", "prefill_chunk")


class RequestError(ValueError):
    """A generation request that cannot run (context, cache, memory or sampling); ``arg`` names
    the argument at fault (one of :data:`ARGS`).

    ``detail`` may name other arguments as ``{max_len}``-style fields: :meth:`message` fills
    them with the caller's names (Python keywords by default, or the CLI's flags)."""

    def __init__(self, arg: str, detail: str):
        self.arg, self.detail = arg, detail
        super().__init__(self.message())

    def message(self, names: dict[str, str] | None = None) -> str:
        names = {k: k for k in ARGS} | (names or {})
        return f"{names[self.arg]}: {self.detail.format(**names)}"


def bucket(n: int) -> int:
    """Padded width for n tokens: a multiple of 64 and of 1/8 of the next power of two, so
    prompt widths (and cache lengths) fall into a few shapes per octave (< 25% padding above
    512 tokens) and a new length rarely recompiles."""
    n = max(int(n), 1)
    step = max(64, 1 << max(0, (n - 1).bit_length() - 3))
    return -(-n // step) * step


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


def decoder_copy_bytes(model) -> int:
    """Bytes a Decoder adds to the loaded weights: their compute-dtype copy (none for float32
    models) and the decode steps' fused projection matrices (``decode.step_state``)."""
    import numpy as np
    from flax import nnx

    weights = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
    item = np.dtype(model.dtype).itemsize
    copy = 0 if model.dtype == jnp.float32 else weights * item // 4
    return copy + sum(sum(p.kernel.size for p in m.step_projections()) * item
                      for _, m in nnx.iter_modules(model) if hasattr(m, "fuse_step_weights"))


def free_memory(model, memory_limit: int | None = None) -> int | None:
    """Bytes available for the KV caches and the prefill workspace, before a Decoder exists.

    On a device reporting memory stats (GPU): its ``bytes_limit - bytes_in_use`` (the weights are
    already loaded) less what a Decoder copies (:func:`decoder_copy_bytes`). Elsewhere (CPU): the
    host's available RAM less that. ``memory_limit`` (bytes for weights + caches + prefill;
    the CLI's ``--memory-limit`` is in GiB) caps either; one that does not hold the weights and
    their copy is a :class:`RequestError` naming it. None: unknown, no check."""
    from flax import nnx

    weights = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
    copy = decoder_copy_bytes(model)
    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0) - copy
    else:
        avail = _mem_available()
        free = None if avail is None else avail - copy
    if memory_limit is not None:
        mine = memory_limit - weights - copy
        if mine <= 0:
            raise RequestError("memory_limit", f"{gib(memory_limit)} does not hold the weights "
                                               f"({gib(weights)}) and the decoder's copy of them "
                                               f"({gib(copy)})")
        free = mine if free is None else min(free, mine)
    return free


def check_sampling(temperature: float, top_k: int, top_p: float, seed: int,
                   steps_per_call: int) -> None:
    """The sampling arguments of :func:`nsa_jax.generate.generate_batch` (the CLI runs the same
    check before it loads the run): out of range they would sample silently from other
    distributions (a negative or NaN temperature as 1, top_p 0 as token 0, an infinite
    temperature as a vocabulary padding id)."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t >= 0):
        raise RequestError("temperature", f"must be a finite number >= 0 (0 = greedy), got "
                                          f"{temperature}")
    if int(top_k) != top_k or top_k < 0:
        raise RequestError("top_k", f"must be >= 0 (0 = off; an integer), got {top_k}")
    if not 0 < top_p <= 1:
        raise RequestError("top_p", f"must be in (0, 1] (1 = off), got {top_p}")
    if int(seed) != seed or not -(1 << 63) <= seed < (1 << 63):
        raise RequestError("seed", f"must be an integer in [-2**63, 2**63), got {seed}")
    if int(steps_per_call) != steps_per_call or steps_per_call < 1:
        raise RequestError("steps_per_call", f"must be >= 1 (an integer), got {steps_per_call}")


def check_request(prompts, max_new_tokens: int, max_len: int) -> None:
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
    if n == max_len:
        raise RequestError("prompts", f"prompt {longest} has {n} tokens, the whole context "
                                      f"{{max_len}}={max_len}: no new token fits (a shorter "
                                      f"prompt or a larger {{max_len}})")
    if n + max_new_tokens > max_len:
        raise RequestError("max_new_tokens", f"prompt {longest} ({n} tokens) + {max_new_tokens} "
                                             f"new tokens exceed the context {{max_len}}="
                                             f"{max_len}; at most {max_len - n} new tokens fit")


def check_memory(model, prompts, cache_len: int, free: int | None) -> None:
    """Refuse before allocating when the batch's KV caches do not fit in ``free`` bytes."""
    from nsa_jax.decode import init_cache

    if free is None:
        return

    def cache_for(rows, length):
        return cache_bytes(jax.eval_shape(lambda: init_cache(model, rows, length)))

    B, longest = len(prompts), max(len(p) for p in prompts)
    row, prompt_only = cache_for(1, cache_len), cache_for(1, min(bucket(longest), cache_len))
    if prompt_only > free:
        raise RequestError("prompts", f"a prompt of {longest} tokens needs a "
                                      f"{gib(prompt_only)} KV cache, more than the "
                                      f"{gib(max(free, 0))} free")
    if row > free:
        raise RequestError("max_new_tokens", f"one row of {cache_len} tokens (prompt + new) "
                                             f"needs a {gib(row)} KV cache, more than the "
                                             f"{gib(max(free, 0))} free")
    if B * row > free:
        raise RequestError("prompts", f"{B} prompts need {gib(B * row)} of KV cache at "
                                      f"{cache_len} tokens per row, {gib(free)} free: at "
                                      f"most {free // row} prompts fit (by their KV caches "
                                      f"alone; the prefill needs memory on top)")


def chunk_sizes(dec, width: int) -> list[int]:
    """Prefill chunk lengths to try for prompts of ``width`` tokens, largest first: the chunk
    unit times powers of two, below ``width``."""
    u = dec.chunk_unit
    out = []
    c = u
    while c < width:
        out.append(c)
        c *= 2
    return out[::-1]


def fit_prefill(dec, width: int, free: int | None, longest: int,
                chunk: int | None = None) -> tuple[int, int | None]:
    """(rows per prefill group, chunk) for prompts padded to ``width``: :func:`fit_rows` at the
    whole width; when not even one row fits, one row at a time in the largest chunk of
    :func:`chunk_sizes` that fits (``Decoder.prefill_rows`` with ``chunk``; found by a binary
    search, since each length tried compiles); when none does, an error naming the smallest's
    need. A given ``chunk`` is used as is (rows: as many as fit with it)."""
    if chunk is not None:
        return fit_rows(dec, width, free, longest, chunk), chunk
    try:
        return fit_rows(dec, width, free, longest), None
    except RequestError:
        sizes = chunk_sizes(dec, width)
        if not sizes:
            raise
    caches = cache_bytes(dec.cache)
    left = free - caches

    def probe(c):
        n = dec.prefill_bytes(1, width, chunk=c)    # compiles two calls per length tried
        return n, n is None or n <= left

    c = sizes[-1]
    need, ok = probe(c)
    if ok:        # a binary search (the need shrinks with the chunk): log2(len(sizes)) more tries
        lo, hi = 0, len(sizes) - 1                  # sizes[hi] fits
        while lo < hi:
            mid = (lo + hi) // 2
            if probe(sizes[mid])[1]:
                hi = mid
            else:
                lo = mid + 1
        return 1, sizes[hi]
    fit = (free - need) * dec.batch // caches if caches else 0
    if 1 <= fit < dec.batch:          # fewer rows would leave the smallest chunk room: say so
        raise RequestError("prompts", f"{dec.batch} prompts' KV caches ({gib(caches)}) leave "
                                      f"{gib(max(left, 0))} of {gib(free)} free, and prefilling "
                                      f"one row in chunks of {c} tokens needs {gib(need)}: at "
                                      f"most {fit} prompts fit")
    raise RequestError("prompts", f"prefilling a prompt of {longest} tokens (padded to {width}) "
                                  f"needs {gib(need)} even in chunks of {c} tokens, more than "
                                  f"the {gib(max(left, 0))} the KV caches leave free")


def check_chunk(chunk, unit: int) -> None:
    """``prefill_chunk``: None (chunks only where a prompt's prefill does not fit at once) or a
    positive multiple of the model's chunk unit (``Decoder.chunk_unit``)."""
    from nsa_jax.decode import chunk_ok

    if chunk is not None and not chunk_ok(chunk, unit):
        raise RequestError("prefill_chunk", f"must be a positive multiple of {unit} tokens for "
                                            f"this model, got {chunk}")


def fit_rows(dec, width: int, free: int | None, longest: int, chunk: int | None = None) -> int:
    """The most rows (B, B/2, ..., 1) whose prefill (in chunks of ``chunk`` tokens, if given)
    fits in what the caches leave free."""
    g = dec.batch
    if free is None:
        return g
    left = free - cache_bytes(dec.cache)
    while True:
        need = dec.prefill_bytes(g, width) if chunk is None else dec.prefill_bytes(
            g, width, chunk=chunk)
        if need is None or need <= left:
            return g
        if g == 1:
            caches = cache_bytes(dec.cache)
            fit = (free - need) * dec.batch // caches if caches else 0
            if 1 <= fit < dec.batch:      # fewer rows would leave the prefill room: say so
                raise RequestError("prompts", f"{dec.batch} prompts' KV caches "
                                              f"({gib(caches)}) leave {gib(max(left, 0))}"
                                              f" of {gib(free)} free, and prefilling one row of "
                                              f"{width} tokens needs {gib(need)}: at most {fit} "
                                              f"prompts fit")
            raise RequestError("prompts", f"prefilling a prompt of {longest} tokens (padded to "
                                          f"{width}) needs {gib(need)}, more than the "
                                          f"{gib(max(left, 0))} the KV caches leave free")
        g = -(-g // 2)


def decode_calls(max_new_tokens: int, steps_per_call: int) -> list[tuple[int, bool]]:
    """The (steps, feed_last) of the decode calls :func:`nsa_jax.generate.generate_batch` makes
    for ``max_new_tokens`` tokens per row, each shape once: calls of ``steps_per_call`` tokens
    that feed their last ids, then a last call of the tokens left that does not."""
    k = int(steps_per_call)
    full = [(k, True)] if max_new_tokens > k else []
    return full + [((max_new_tokens - 1) % k + 1, False)]


def decode_need(dec, calls, sampling: dict) -> tuple[int | None, dict]:
    """(the largest ``Decoder.decode_bytes`` of ``calls`` with the ``sampling`` settings, None
    where the backend gives no memory analysis; each call's compile seconds). Compiles the
    calls: the executables ``Decoder.decode`` runs later."""
    need, compiled = 0, {}
    for steps, feed_last in calls:
        c0 = dec.compile_s
        n = dec.decode_bytes(steps, feed_last=feed_last, **sampling)
        compiled[(steps, feed_last)] = dec.compile_s - c0
        if n is None:
            return None, compiled
        need = max(need, n)
    return need, compiled


def check_decode(dec, max_new_tokens: int, steps_per_call: int, free: int | None,
                 **sampling) -> dict:
    """Refuse before the prefill when the decode calls of a generation (:func:`decode_calls`)
    do not fit in what the batch's KV caches leave of ``free`` bytes: the largest call's
    ``Decoder.decode_bytes`` (its logits, ids, sampling temporaries such as top-p's sort over
    the vocabulary, and the model step's temporaries) with ``sampling`` (temperature, top_k,
    top_p, vocab_limit, eos_id as ``Decoder.decode`` gets them). It grows with the batch
    (logits, sampling: [B, V] each) and, far less, with the steps per call (the ids [B, steps]):
    the error names ``steps_per_call`` where calls of 1 step fit and the part that grows with
    the steps is most of the need (probed by compiling the 1-step calls), else the prompts,
    with the count that fits (at most: the need scaled by rows). Returns each call's compile
    seconds ({(steps, feed_last): s}: its executable is compiled here, for the caller's
    timing); None ``free``: no check, nothing compiled."""
    if free is None:
        return {}
    need, compiled = decode_need(dec, decode_calls(max_new_tokens, steps_per_call), sampling)
    caches = cache_bytes(dec.cache)
    left = free - caches
    if need is None or need <= left:
        return compiled
    B, k = dec.batch, min(int(steps_per_call), max_new_tokens)
    fit = free * B // (caches + need)
    if k > 1:
        one = decode_need(dec, decode_calls(max_new_tokens, 1), sampling)[0]
        if one is not None and one <= left and need - one > one:
            raise RequestError("steps_per_call", f"decoding {B} prompt(s) {k} tokens per call "
                                                 f"needs {gib(need)}, more than the "
                                                 f"{gib(max(left, 0))} the KV caches leave of "
                                                 f"{gib(free)} free; 1 token per call needs "
                                                 f"{gib(one)}: a {{steps_per_call}} below {k} "
                                                 f"fits (at {k}, at most {fit} prompts fit)")
    if fit < 1:
        raise RequestError("prompts", f"decoding {B} prompt(s) {k} tokens per call needs "
                                      f"{gib(need)} beside {gib(caches)} of KV caches, more "
                                      f"than the {gib(max(free, 0))} free: not even one prompt "
                                      f"fits")
    raise RequestError("prompts", f"{B} prompts' KV caches ({gib(caches)}) leave "
                                  f"{gib(max(left, 0))} of {gib(free)} free, and decoding them "
                                  f"{k} tokens per call needs {gib(need)}: at most {fit} "
                                  f"prompts fit")
