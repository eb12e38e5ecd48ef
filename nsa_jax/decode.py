"""Incremental decoding: the KV-cache layout and the ``Decoder`` driver (prefill at once, in row
groups or in chunks; decode steps). Keys read per step: :mod:`nsa_jax.nsa.reads`.

Decoding is a mode of the model (:meth:`nsa_jax.model.NSALM.extend`): each attention module takes
its layer's :class:`LayerCache` and returns it updated. The attention math of one new token lives
in :mod:`nsa_jax.nsa.decoding` (jax.numpy) and :mod:`nsa_jax.pallas.decode` (kernels); this module
only says where tokens are stored, and drives prefill and decode (the jitted calls:
:mod:`nsa_jax.decode_loop`).

Caches are fixed-shape (``max_len`` given up front) so one jitted step serves every position, and
every batch row has its own position (prompts of different lengths share one batch). The per-layer
arrays are described in :mod:`nsa_jax.nsa.decoding`; dense layers hold ``k, v`` [B,G,max_len,D].
Caches of ablated branches are not allocated (the compressed cache is kept while ``slc`` is on,
since selection scores come from it).

How tokens enter the caches (prefill fills, decode appends, φ emission) lives in
:mod:`nsa_jax.cache_update`; the memory the decoder's calls need, in :mod:`nsa_jax.decode_memory`.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nsa_jax.decode_loop import (StaticGraph, decode_loop_jit, extend_jit, flat_state,
                                prefill_jit, put_rows_jit, step_jit)
from nsa_jax.decode_memory import CallBytes, cache_bytes  # noqa: F401 (cache_bytes re-exported)
from nsa_jax.nsa import NSAConfig
from nsa_jax.nsa.decoding import SYNC_SLOTS

Cache = dict[str, Any]


class DecodeError(ValueError):
    """Invalid decode request (prompt too long, cache full, ...); the message says which."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerCache:
    """One layer's cache as an attention module sees it.

    kv:  the layer's arrays (layout in :mod:`nsa_jax.nsa.decoding`);
    pos: int32 [B], tokens already in the cache per row (a decode step writes position ``pos``);
    n:   int32 [B], valid tokens of this call per row (prefill: the prompt lengths; a prompt is
         right-padded to the longest, and padding is never visible to a valid position);
    start: None, or int32 [] for a continuation chunk of a chunked prefill: the call's tokens
         sit at positions start.. in every row (:mod:`nsa_jax.nsa.chunked`).
    """
    kv: dict
    pos: jax.Array
    n: jax.Array
    start: jax.Array | None = None


# ---- layout ---------------------------------------------------------------------------------
def _nsa_needs(cfg: NSAConfig) -> tuple[bool, bool, bool]:
    """(compressed cache, selection cache, window cache) needed for the enabled branches."""
    br = cfg.branches
    return ("cmp" in br or "slc" in br), "slc" in br, "win" in br


ALIGN = 256  # cache lengths are padded to a multiple of this (masked slots)


def _align(n: int) -> int:
    """Round up to a multiple of ALIGN: XLA's GPU matmuls pad a contraction over the cache length
    to a multiple of 256, copying the whole cache every step (seen on an H200: 0.98 ms per step
    for the dense 125M model at 64k, batch 8, with caches a multiple of 64 only); the extra slots
    are never visible."""
    return -(-max(n, 1) // ALIGN) * ALIGN


def cache_sizes(cfg: NSAConfig, max_len: int) -> dict[str, int]:
    """Sequence lengths of the NSA caches for ``max_len`` tokens."""
    return {
        "cmp": _align(cfg.num_cmp_blocks(max_len) + 1),   # + the scratch slot (last)
        "slc": cfg.num_sel_blocks(max_len) * cfg.sel_block,
        "win": min(cfg.window, max_len),
        "raw": cfg.block_l,
    }


def init_cache(model, batch: int, max_len: int) -> Cache:
    """Empty caches for ``batch`` sequences of up to ``max_len`` tokens (prompt + generation):
    ``{"pos": int32 [B], "layers": [dict per layer]}``."""
    if batch < 1:
        raise DecodeError(f"batch must be >= 1, got {batch}")
    if max_len < 1:
        raise DecodeError(f"max_len must be >= 1, got {max_len}")
    return _zero_cache(model.mcfg, model.ncfg, jnp.dtype(model.dtype), batch, max_len)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _zero_cache(m, cfg: NSAConfig, dt, batch: int, max_len: int) -> Cache:
    """:func:`init_cache`'s arrays, all in one call: built by as many eager ``jnp.zeros`` (~110
    for the 125M model) they cost the host ~36 ms before each prefill on an H200 machine
    (bench/NOTES.md, fiftieth session)."""
    G, D = m.n_kv_groups, m.head_dim

    def z(S):
        return jnp.zeros((batch, G, S, D), dt)

    layers = []
    for _ in range(m.n_layers):
        if m.attention == "dense":
            layers.append({"k": z(_align(max_len)), "v": z(_align(max_len))})
            continue
        need_cmp, need_slc, need_win = _nsa_needs(cfg)
        sz = cache_sizes(cfg, max_len)
        lc = {}
        if need_cmp:     # + the counters of the Pallas φ emission (nsa_jax.nsa.decoding)
            lc.update(k_cmp=z(sz["cmp"]), v_cmp=z(sz["cmp"]), kc_raw=z(sz["raw"]),
                      vc_raw=z(sz["raw"]), sync=jnp.zeros((batch, G, SYNC_SLOTS), jnp.int32))
        if need_slc:
            lc.update(k_slc=z(sz["slc"]), v_slc=z(sz["slc"]))
        if need_win:
            lc.update(k_win=z(sz["win"]), v_win=z(sz["win"]))
        layers.append(lc)
    return {"pos": jnp.zeros((batch,), jnp.int32), "layers": layers}


# ---- the driver -----------------------------------------------------------------------------
def inference_state(model):
    """The model's parameters in its compute dtype (bfloat16 models: cast once, not every step).

    Parameters are cast where they are used anyway, so the logits do not change; the exception is
    φ (``phi_k``/``phi_v``), which folds its position embedding into its bias in float32, so its
    parameters stay float32. The graph comes as a :class:`~nsa_jax.decode_loop.StaticGraph`
    (hashed once: the jitted calls take it as a static argument; ``graph.merge(state)`` gives
    the module, ``graph.graphdef`` the nnx GraphDef)."""
    graphdef, state = nnx.split(model)
    graphdef = StaticGraph.of(graphdef)
    dt = model.dtype
    if dt == jnp.float32:
        return graphdef, state

    def cast(path, a):
        keep = any(str(getattr(p, "key", p)).startswith("phi_") for p in path)
        return a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) and not keep else a

    return graphdef, jax.tree_util.tree_map_with_path(cast, state)


def step_state(model, state):
    """:func:`inference_state`'s ``state`` -> (graph, state) for the decode steps, the graph a
    :class:`~nsa_jax.decode_loop.StaticGraph` (``graph.merge(state)`` gives the module):

    * φ's matrices and biases also in the compute dtype (its position embedding stays float32).
      The step's φ (:func:`nsa_jax.nsa.compression.compress_block`) casts them at their use, so
      the step's values are bit-identical; casting once here takes 3 weight converts per layer
      out of every step (bench/NOTES.md, twelfth session). Prefill keeps
      :func:`inference_state`'s float32 φ, whose training form folds the position embedding
      through w1 in float32.
    * each layer's step projections as one matrix (``fuse_step_weights``: NSA's wq, wkv, wg;
      dense's wq, wkv), added to a copy of the model graph: the Pallas decode path reads q and
      K/V from one matmul's output in place (bench/NOTES.md, thirteenth session; dense the same
      since the forty-fourth).

    Other leaves are shared, not copied; ``w_step`` is a new matrix (a second copy of those
    weights, counted by ``request.free_memory``)."""
    dt = model.dtype

    def cast(path, a):
        keys = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
        i = next((j for j, k in enumerate(keys) if k.startswith("phi_")), None)
        phi = i is not None and i + 1 < len(keys) and keys[i + 1] in ("w1", "b1", "w2", "b2")
        return a.astype(dt) if phi else a

    if dt != jnp.float32:
        state = jax.tree_util.tree_map_with_path(cast, state)
    copy = nnx.merge(nnx.graphdef(model), state)
    for mod in [m for _, m in nnx.iter_modules(copy) if hasattr(m, "fuse_step_weights")]:
        mod.fuse_step_weights()
    graphdef, state = nnx.split(copy)
    return StaticGraph.of(graphdef), state


def chunk_unit(model) -> int:
    """Prefill chunks are multiples of this: ``nsa.sel_block`` for NSA (a chunk then starts on a
    selection block, a multiple of d, past the first compressed block), 64 for dense."""
    return model.ncfg.sel_block if model.mcfg.attention == "nsa" else 64


def chunk_ok(chunk, unit: int) -> bool:
    """A prefill chunk length: a positive integer multiple of ``unit`` (:func:`chunk_unit`)."""
    return int(chunk) == chunk and chunk >= unit and chunk % unit == 0


_EXECS: dict = {}      # AOT-compiled prefill and decode calls, shared by Decoders of one model
_EXECS_MAX = 32


class Decoder(CallBytes):
    """Jitted prefill + decode for one model and fixed (batch, max_len).

    >>> dec = Decoder(model, batch=2, max_len=512)
    >>> logits = dec.prefill(prompt_ids, lengths=[7, 3])   # [B,V] at each row's last token
    >>> logits = dec.step(next_ids)                         # one token per row, repeat
    >>> ids, logits, key, done = dec.decode(logits, 16, key, temperature=0)  # or 16 at a time

    A batch whose prefill does not fit at once is prefilled in row groups, each from an empty
    g-row cache written into its rows of the batch cache:

    >>> dec.prefill_rows([0, 1], ids[:2], lengths=[7, 3])  # any order, any group sizes
    >>> dec.prefill_rows([2, 3], ids[2:], lengths=[5, 9])  # step() once every row is filled

    A prompt whose prefill does not fit even alone is prefilled in chunks of ``chunk`` tokens (a
    multiple of :attr:`chunk_unit`): the first as a prefill, each next one attending over the
    cache the earlier ones filled (:mod:`nsa_jax.nsa.chunked`), with the same logits:

    >>> logits = dec.prefill(ids, lengths=[9000, 300], chunk=2048)

    Prefill and :meth:`decode` calls are compiled ahead of time, once per shape (prefill: rows,
    width, all_logits; decode: steps and the sampling settings): their compile seconds
    accumulate in ``compile_s`` (so throughput can exclude them) and :meth:`prefill_bytes`
    reads a prefill's memory needs from XLA before anything runs.

    ``graphdef, state`` (prefill) and ``step_graphdef, step_state`` (the steps) are the model
    as :func:`inference_state` and :func:`step_state` give it (``step_graphdef.merge(
    step_state)`` is the steps' module); they are read when the Decoder is made, so assigning
    new ones later changes nothing: make a new Decoder for new weights.
    """

    def __init__(self, model, batch: int, max_len: int):
        self.graphdef, self.state = inference_state(model)
        # φ cast, the projections fused: the decode steps' own graph and state
        self.step_graphdef, self.step_state = step_state(model, self.state)
        # what the step calls take: the graph with the state's structure, the state's arrays
        self._step_g, self._step_leaves = flat_state(self.step_graphdef, self.step_state)
        self.model = model
        self.batch, self.max_len = batch, max_len
        self.cache = init_cache(model, batch, max_len)
        self.lengths = None
        self.steps = 0
        self.compile_s = 0.0
        self._filled: list[int | None] = [None] * batch
        self._sig = tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(self.state))

    @property
    def pos(self) -> int:
        """Largest position reached over the rows (tokens in the longest row's cache)."""
        return 0 if self.lengths is None else int(max(self.lengths)) + self.steps

    def reset(self) -> None:
        self.cache = init_cache(self.model, self.batch, self.max_len)
        self.lengths, self.steps = None, 0
        self._filled = [None] * self.batch

    # ---- prefill ---------------------------------------------------------------------------
    def _compiled(self, key: tuple, lower):
        """``lower().compile()``, cached per model and ``key`` across Decoders (a new Decoder of
        a seen shape does not compile); compile seconds go to ``compile_s``."""
        key = (self.graphdef, self._sig, self.max_len) + key
        if key not in _EXECS:
            t0 = time.perf_counter()
            run = lower().compile()
            self.compile_s += time.perf_counter() - t0
            if len(_EXECS) >= _EXECS_MAX:
                _EXECS.pop(next(iter(_EXECS)))
            _EXECS[key] = run
        return _EXECS[key]

    def _exec(self, rows: int, width: int, all_logits: bool):
        """The prefill of ``rows`` rows right-padded to ``width`` tokens."""
        return self._compiled(("prefill", rows, width, bool(all_logits)), lambda: prefill_jit.lower(
            self.graphdef, self.state, jax.ShapeDtypeStruct((rows, width), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32), self._cache_shape(rows),
            bool(all_logits)))

    def _cache_shape(self, rows: int):
        """The shapes of a ``rows``-row cache (traced only when a call is compiled)."""
        return jax.eval_shape(lambda: init_cache(self.model, rows, self.max_len))

    def _put_exec(self, part: Cache, rows):
        """Writing the g-row cache ``part`` into rows ``rows`` [g] of the batch cache, lowered
        for the actual arrays: its outputs are placed (committed) as a jitted call's would be,
        so the next decode step does not compile again."""
        g = rows.shape[0]
        return self._compiled(("put", self.batch, g),
                              lambda: put_rows_jit.lower(self.cache, part, rows))

    def _extend_exec(self, rows: int, width: int, all_logits: bool):
        """A continuation chunk of ``width`` tokens for ``rows`` rows (chunked prefill)."""
        sds = jax.ShapeDtypeStruct
        logits = None if all_logits else sds((rows, self.model.mcfg.vocab_size), jnp.float32)
        return self._compiled(("extend", rows, width, bool(all_logits)), lambda: extend_jit.lower(
            self.graphdef, self.state, sds((rows, width), jnp.int32), sds((rows,), jnp.int32),
            sds((), jnp.int32), self._cache_shape(rows), logits, bool(all_logits)))

    @property
    def chunk_unit(self) -> int:
        """:func:`chunk_unit` of the model."""
        return chunk_unit(self.model)

    def _check_chunk(self, chunk: int) -> int:
        if not chunk_ok(chunk, self.chunk_unit):
            raise DecodeError(f"chunk must be a positive multiple of {self.chunk_unit} tokens, "
                              f"got {chunk}")
        return int(chunk)

    def _decode_exec(self, logits, key, done, *, steps, temperature, top_k, top_p, vocab_limit,
                     eos_id, feed_last):
        """The compiled decode loop (:func:`nsa_jax.decode_loop.decode_loop_jit`) for these
        arguments' shapes and sampling settings: one executable per (shapes, settings), shared
        by :meth:`decode` and :meth:`decode_bytes`."""
        statics = dict(steps=steps, temperature=float(temperature), top_k=int(top_k),
                       top_p=float(top_p),
                       vocab_limit=None if vocab_limit is None else int(vocab_limit),
                       eos_id=None if eos_id is None else int(eos_id), feed_last=bool(feed_last))
        return self._compiled(
            ("decode", self.batch, logits.shape, key.shape, str(key.dtype),
             tuple(sorted(statics.items()))),
            lambda: decode_loop_jit.lower(self._step_g, self._step_leaves, self.cache,
                                          logits, key, done, **statics))

    def _check_shape(self, rows: int, width: int) -> None:
        if not 1 <= rows <= self.batch:
            raise DecodeError(f"a prefill covers 1..{self.batch} rows, got {rows}")
        if width < 1:
            raise DecodeError("prompt must hold at least one token")
        if width > self.max_len:
            raise DecodeError(f"prompt of {width} tokens exceeds max_len={self.max_len}")

    def prefill(self, tokens, lengths=None, all_logits: bool = False, chunk: int | None = None):
        """tokens [B,P] (rows right-padded to P), lengths [B] (default P for every row); chunk
        as in :meth:`prefill_rows`."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2 or tokens.shape[0] != self.batch:
            raise DecodeError(f"prompt must have shape [batch={self.batch}, P], got "
                              f"{tuple(tokens.shape)}")
        return self.prefill_rows(range(self.batch), tokens, lengths, all_logits, chunk)

    def prefill_rows(self, rows, tokens, lengths=None, all_logits: bool = False,
                     chunk: int | None = None):
        """Prefill rows ``rows`` (g distinct indices) with tokens [g,P] (right-padded to P),
        lengths [g] (default P each), from empty: each row's earlier contents are replaced.
        After a decode step, the next prefill starts the whole batch afresh. Returns the rows'
        logits like :meth:`prefill` ([g,V], or [g,P,V] with ``all_logits``).

        ``chunk`` (a multiple of :attr:`chunk_unit`; None or >= P: at once): tokens 0..chunk-1
        are prefilled, then each next ``chunk`` tokens attend over the cache filled so far
        (:func:`nsa_jax.decode_loop.extend_jit`; two compiled calls whatever P); the peak
        memory is that of a chunk (:meth:`prefill_bytes`)."""
        rows = [int(r) for r in rows]
        tokens = jnp.asarray(tokens, jnp.int32)
        g = len(rows)
        if tokens.ndim != 2 or tokens.shape[0] != g:
            raise DecodeError(f"prompt must have shape [rows={g}, P], got {tuple(tokens.shape)}")
        if len(set(rows)) != g or any(not 0 <= r < self.batch for r in rows):
            raise DecodeError(f"rows must be distinct indices in [0, {self.batch}), got {rows}")
        P = tokens.shape[1]
        lengths = [P] * g if lengths is None else [int(n) for n in lengths]
        if len(lengths) != g:
            raise DecodeError(f"lengths must hold {g} values, got {len(lengths)}")
        if P < 1 or min(lengths, default=1) < 1:
            raise DecodeError("prompt must hold at least one token")
        if max(lengths) > P:
            raise DecodeError(f"lengths {lengths} exceed the prompt width P={P}")
        self._check_shape(g, P)
        if chunk is not None and self._check_chunk(chunk) >= P:
            chunk = None
        whole = rows == list(range(self.batch))
        if self.steps or (whole and any(n is not None for n in self._filled)):
            self.reset()
        C = P if chunk is None else chunk
        cache = self.cache if whole else init_cache(self.model, g, self.max_len)
        logits, cache = self._exec(g, C, all_logits)(
            self.state, tokens[:, :C], jnp.asarray([min(n, C) for n in lengths], jnp.int32),
            cache)
        if chunk is not None:
            logits, cache = self._continue(tokens, lengths, chunk, all_logits, logits, cache)
        if whole:
            self.cache = cache
        else:
            idx = jnp.asarray(rows, jnp.int32)
            self.cache = self._put_exec(cache, idx)(self.cache, cache, idx)
        for r, n in zip(rows, lengths):
            self._filled[r] = n
        if all(n is not None for n in self._filled):
            self.lengths = list(self._filled)
        return logits

    def _continue(self, tokens, lengths, chunk: int, all_logits: bool, logits, cache):
        """The continuation chunks of :meth:`prefill_rows` (tokens [g,P], the first chunk done:
        ``logits`` and ``cache`` its outputs) -> (logits, cache)."""
        g, P = tokens.shape
        run = self._extend_exec(g, chunk, all_logits)
        lens = jnp.asarray(lengths, jnp.int32)
        pieces = [logits]
        for s in range(chunk, P, chunk):
            piece = tokens[:, s:s + chunk]
            if piece.shape[1] < chunk:                 # the last chunk, right-padded
                piece = jnp.pad(piece, ((0, 0), (0, chunk - piece.shape[1])))
            out, cache = run(self.state, piece, lens, jnp.int32(s), cache,
                             None if all_logits else logits)
            if all_logits:
                pieces.append(out)
            else:
                logits = out
        return (jnp.concatenate(pieces, axis=1)[:, :P] if all_logits else logits), cache

    # ---- decode ----------------------------------------------------------------------------
    def _check_prefilled(self, what: str) -> None:
        if self.lengths is None:
            missing = [r for r, n in enumerate(self._filled) if n is None]
            if len(missing) < self.batch:
                raise DecodeError(f"call prefill_rows for rows {missing} before {what}")
            raise DecodeError(f"call prefill with a prompt before {what}")

    def step(self, tokens):
        tokens = jnp.asarray(tokens, jnp.int32).reshape(-1)
        if tokens.shape[0] != self.batch:
            raise DecodeError(f"step needs one token per sequence ({self.batch}), got "
                              f"{tokens.shape[0]}")
        self._check_prefilled("step")
        if self.pos >= self.max_len:
            raise DecodeError(f"cache full: max_len={self.max_len} tokens")
        logits, self.cache = step_jit(self._step_g, self._step_leaves, self.cache, tokens)
        self.steps += 1
        return logits

    def decode(self, logits, steps: int, key, *, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, vocab_limit: int | None = None, eos_id: int | None = None,
               done=None, feed_last: bool = True):
        """``steps`` tokens per row in one jitted call
        (:func:`nsa_jax.decode_loop.decode_loop_jit`): sample from ``logits`` [B,V] with ``key``
        (split once per token, as a host loop of ``key, sub = jax.random.split(key)`` +
        ``sample`` does), feed the ids to the model, repeat.

        Returns (ids int32 [B,steps], logits [B,V] after the last fed ids, key, done): pass the
        logits and key back to continue the same stream. ``done`` (bool [B], default all False)
        is or-ed with ``ids == eos_id``; done rows keep stepping. Sampling settings as in
        :func:`nsa_jax.sampling.sample`; each (steps, settings, feed_last) compiles once.

        Every sampled id is fed (it takes a cache slot), so ``pos + steps <= max_len`` is
        needed; with ``feed_last=False`` the last ids are not fed (the end of a generation:
        ``steps - 1`` slots, and the returned logits are those the last ids came from).
        ``self.steps`` advances by the tokens fed.
        """
        steps = int(steps)
        if steps < 1:
            raise DecodeError(f"steps must be >= 1, got {steps}")
        logits = jnp.asarray(logits, jnp.float32)
        if logits.ndim != 2 or logits.shape[0] != self.batch:
            raise DecodeError(f"logits must have shape [batch={self.batch}, V], got "
                              f"{tuple(logits.shape)}")
        self._check_prefilled("decode")
        fed = steps if feed_last else steps - 1
        if self.pos + fed > self.max_len:
            raise DecodeError(f"cache full: decoding steps={steps} tokens from position "
                              f"{self.pos} feeds {fed}, {self.max_len - self.pos} slot(s) left "
                              f"of max_len={self.max_len}")
        done = (jnp.zeros((self.batch,), bool) if done is None
                else jnp.asarray(done, bool).reshape(self.batch))
        key = key if isinstance(key, jax.Array) else jnp.asarray(key)
        run = self._decode_exec(logits, key, done, steps=steps, temperature=temperature,
                                top_k=top_k, top_p=top_p, vocab_limit=vocab_limit,
                                eos_id=eos_id, feed_last=feed_last)
        ids, logits, self.cache, key, done = run(self._step_leaves, self.cache, logits, key,
                                                 done)
        self.steps += fed
        return ids, logits, key, done
