"""The jitted calls of decoding: prefill (and a chunked prefill's continuation chunks), one
decode step, and ``steps`` decode steps with sampling in one call (:func:`decode_loop_jit`).
:class:`nsa_jax.decode.Decoder` drives them (and re-exports them from :mod:`nsa_jax.decode`); the
cache layout is :mod:`nsa_jax.decode`'s.

Why a loop in one call: a host loop of ``sample`` + ``step`` per token pays the per-call host
cost (dispatch, the copy of the ids to the host, the sync) on every token, and the device idles
in between. :func:`decode_loop_jit` runs ``steps`` iterations of (split the key, sample, feed
the sampled ids to the model) in one ``lax.scan``, so those costs are paid once per ``steps``
tokens; in exchange the ids reach the host ``steps`` at a time.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from nsa_jax.sampling import sample_ids


class StaticGraph:
    """An nnx ``GraphDef`` (and, from :func:`flat_state`, its state's tree structure) as a jit
    static argument, hashed once.

    jit hashes its static arguments on every call, and nnx recomputes a GraphDef's hash from
    its whole node tree each time: 2.1 ms per call for nsa_125m on a 2-core CPU, paid by every
    :func:`step_jit` / :func:`decode_loop_jit` call (and every lookup of an AOT-compiled call
    keyed by it) before the launch (bench/NOTES.md, fourteenth session). Equal wrapped graphs
    compare equal, so the jit cache behaves as with the bare GraphDef; :meth:`of` returns one
    instance per graph, so a later Decoder of the same model hits the jit cache by identity
    instead of comparing the graphs node by node (~0.5 ms) on every call.
    """
    __slots__ = ("graphdef", "treedef", "_hash")
    _interned: dict = {}
    _INTERNED_MAX = 64

    def __init__(self, graphdef, treedef=None):
        self.graphdef = graphdef.graphdef if isinstance(graphdef, StaticGraph) else graphdef
        self.treedef = treedef
        self._hash = hash((self.graphdef, treedef))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, StaticGraph) and self._hash == other._hash
                                 and self.graphdef == other.graphdef
                                 and self.treedef == other.treedef)

    def __repr__(self):
        return f"StaticGraph({self._hash:#x})"

    @classmethod
    def of(cls, graphdef, treedef=None) -> "StaticGraph":
        """The wrapper of ``graphdef`` (and ``treedef``): one instance per equal graph."""
        g = cls(graphdef, treedef)
        known = cls._interned.get(g)
        if known is not None:
            return known
        if len(cls._interned) >= cls._INTERNED_MAX:
            cls._interned.pop(next(iter(cls._interned)))
        cls._interned[g] = g
        return g

    def merge(self, state):
        """The module: ``nnx.merge`` of the graph and ``state`` (flat when the graph carries
        the state's tree structure)."""
        return _merge(self, state)


def flat_state(graphdef, state):
    """-> (:class:`StaticGraph` carrying the state's tree structure, the state's arrays as a
    list) for the jitted calls here: a flat list of arrays is flattened by jit in C++, an nnx
    ``State`` in Python one ``Variable`` at a time (``python bench/dispatch.py``: on a 2-core CPU
    ``step_jit`` returns after 3.4 ms with the State, 2.2 ms with the list, for nsa_125m)."""
    leaves, treedef = jax.tree.flatten(state)
    return StaticGraph.of(graphdef, treedef), leaves


def _merge(graphdef, state):
    """``nnx.merge`` of a bare GraphDef and State, or of a :class:`StaticGraph` and its state
    (flat when the graph carries the tree structure)."""
    if isinstance(graphdef, StaticGraph):
        if graphdef.treedef is not None:
            state = jax.tree.unflatten(graphdef.treedef, state)
        graphdef = graphdef.graphdef
    return nnx.merge(graphdef, state)


def _step(model, cache, tokens):
    """One token per row [B] at its own position -> (float32 logits [B,V], cache)."""
    h, cache = model.extend(tokens[:, None], cache)
    return model.head_logits(h[:, 0]).astype(jnp.float32), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "all_logits"), donate_argnames=("cache",))
def prefill_jit(graphdef, state, tokens, lengths, cache, all_logits=False):
    """Jitted prefill: (float32 logits, cache). Logits [B,P,V] if ``all_logits`` else [B,V] at
    each row's last prompt token."""
    model = _merge(graphdef, state)
    h, cache = model.extend(tokens, cache, lengths)
    if not all_logits:
        h = jnp.take_along_axis(h, (lengths - 1)[:, None, None], axis=1)
    logits = model.head_logits(h).astype(jnp.float32)
    return (logits if all_logits else logits[:, 0]), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "all_logits"),
                   donate_argnames=("cache", "logits"))
def extend_jit(graphdef, state, tokens, lengths, start, cache, logits, all_logits=False):
    """Jitted continuation chunk of a chunked prefill: tokens [B,C] at positions start.. of
    prompts of ``lengths`` [B] tokens (:meth:`nsa_jax.model.NSALM.extend` with ``start``).
    -> (float32 logits, cache): [B,C,V] if ``all_logits``, else ``logits`` [B,V] with the rows
    whose last prompt token is in this chunk replaced by its logits."""
    model = _merge(graphdef, state)
    h, cache = model.extend(tokens, cache, lengths, start=start)
    if all_logits:
        return model.head_logits(h).astype(jnp.float32), cache
    C = tokens.shape[1]
    last = lengths - 1 - start
    h = jnp.take_along_axis(h, jnp.clip(last, 0, C - 1)[:, None, None], axis=1)
    new = model.head_logits(h)[:, 0].astype(jnp.float32)
    inside = (last >= 0) & (last < C)
    return jnp.where(inside[:, None], new, logits), cache


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def step_jit(graphdef, state, cache, tokens):
    """Jitted decode step: one token per row at its own position -> (float32 logits [B,V],
    cache)."""
    return _step(_merge(graphdef, state), cache, tokens)


@functools.partial(jax.jit, donate_argnames=("cache",))
def put_rows_jit(cache, part, rows):
    """``cache`` with rows ``rows`` [g] (distinct) replaced by ``part``, a g-row cache of the same
    max_len (in place: ``cache`` is donated)."""
    return jax.tree.map(lambda a, p: a.at[rows].set(p), cache, part)


@functools.partial(jax.jit, donate_argnames=("cache",),
                   static_argnames=("graphdef", "steps", "temperature", "top_k", "top_p",
                                    "vocab_limit", "eos_id", "feed_last"))
def decode_loop_jit(graphdef, state, cache, logits, key, done, *, steps: int,
                    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    vocab_limit: int | None = None, eos_id: int | None = None,
                    feed_last: bool = True):
    """``steps`` decode iterations in one call -> (ids int32 [B,steps], logits, cache, key, done).

    Iteration i, as the per-token host loop does it: ``key, sub = jax.random.split(key)``; ids
    = :func:`nsa_jax.sampling.sample_ids` (logits, sub, ...) over all rows; ``done |= ids ==
    eos_id`` (bool [B]; unchanged when ``eos_id`` is None); then the model's decode step on the
    ids (as :func:`step_jit`) gives the next float32 logits [B,V]. Rows that are done keep
    stepping with the batch (the caller discards their ids). The returned key and logits carry
    on: a next call continues the same token stream.

    ``feed_last=False`` skips the model step of the last iteration (for the last call of a
    generation, whose last ids are never fed): ``steps - 1`` tokens enter the cache, and the
    returned logits are those the last ids were sampled from.

    With the same key and logits the ids are those of ``steps`` calls of ``sample`` +
    ``step_jit``: the key sequence is the same by construction, and the sampling math is the
    same function. The logits come from the model step compiled inside the scan rather than on
    its own; XLA may fuse or order that body differently, so they may differ from
    :func:`step_jit`'s in the last bits, which would flip a sample only at a near-exact tie
    (identical ids on the CPU in the tests, greedy and sampled).
    """
    model = _merge(graphdef, state)

    def pick(logits, key, done):
        key, sub = jax.random.split(key)
        ids = sample_ids(logits, sub, temperature, top_k, top_p, vocab_limit)
        if eos_id is not None:
            done = done | (ids == eos_id)
        return ids, key, done

    def body(carry, _):
        logits, cache, key, done = carry
        ids, key, done = pick(logits, key, done)
        logits, cache = _step(model, cache, ids)
        return (logits, cache, key, done), ids

    fed = steps if feed_last else steps - 1
    (logits, cache, key, done), ids = jax.lax.scan(body, (logits, cache, key, done), None,
                                                   length=fed)
    if not feed_last:
        last, key, done = pick(logits, key, done)
        ids = jnp.concatenate([ids, last[None]], axis=0)
    return ids.T, logits, cache, key, done
