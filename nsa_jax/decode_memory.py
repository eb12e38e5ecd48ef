"""Device bytes of a :class:`nsa_jax.decode.Decoder`'s calls beyond the weights and the batch
cache, from XLA's memory analysis of the compiled calls (the very executables the decoder then
runs): what ``generate``'s memory checks (:mod:`nsa_jax.request`) compare with free memory."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def tree_bytes(tree) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def cache_bytes(cache) -> int:
    """Bytes of a decoder cache's per-layer arrays (:func:`nsa_jax.decode.init_cache`)."""
    return tree_bytes(cache["layers"])


class CallBytes:
    """The :class:`nsa_jax.decode.Decoder` methods that size its calls (a mixin: they use its
    compiled-call lookups ``_exec``, ``_extend_exec`` and ``_decode_exec``)."""

    def prefill_bytes(self, rows: int, width: int, all_logits: bool = False,
                      chunk: int | None = None) -> int | None:
        """Device bytes one prefill call of ``rows`` x ``width`` tokens needs beyond the weights
        and the batch cache (its g-row cache, inputs, logits and XLA temporaries), from the
        compiled call's memory analysis; None where the backend gives none. With ``chunk``
        (< width): the larger of a first chunk's prefill and a continuation chunk's call.
        Compiles the calls (once; counted in ``compile_s``)."""
        self._check_shape(rows, width)
        runs = [(self._exec(rows, width, all_logits), self._prefill_inputs(rows, width))]
        if chunk is not None and self._check_chunk(chunk) < width:
            logits = 0 if all_logits else rows * self.model.mcfg.vocab_size * 4
            runs = [(self._exec(rows, chunk, all_logits), self._prefill_inputs(rows, chunk)),
                    (self._extend_exec(rows, chunk, all_logits),
                     self._prefill_inputs(rows, chunk) + 4 + logits)]   # + start, logits
        need = 0
        for run, args in runs:
            m = run.memory_analysis()
            if m is None:
                return None
            need = max(need, int(args + m.output_size_in_bytes - m.alias_size_in_bytes
                                 + m.temp_size_in_bytes))
        return need

    def _prefill_inputs(self, rows: int, width: int) -> int:
        """Bytes of a prefill call's inputs other than the state: tokens [rows,width] and
        lengths [rows] (int32), and a g-row cache (rows < batch; the batch cache itself, passed
        and donated where rows = batch, is not new). Counted from their shapes, not as the
        analysis' argument size less the state: XLA drops the state's arrays a call does not
        read (the decode step's fused weights, in a prefill) from its arguments."""
        cache = 0 if rows == self.batch else tree_bytes(self._cache_shape(rows))
        return rows * width * 4 + rows * 4 + cache

    def decode_bytes(self, steps: int, *, temperature: float = 1.0, top_k: int = 0,
                     top_p: float = 1.0, vocab_limit: int | None = None,
                     eos_id: int | None = None, feed_last: bool = True,
                     key=None) -> int | None:
        """Device bytes one :meth:`decode` call of ``steps`` tokens per row with these sampling
        settings needs beyond the weights and the batch cache (which it donates): its inputs
        (logits [B,V], key, done), outputs (ids [B,steps], logits, key, done) and XLA
        temporaries (the sampling's, e.g. top-p's sort over the vocabulary, and the model
        step's), from the compiled call's memory analysis; None where the backend gives none.
        The inputs are counted from their shapes, not as the analysis' argument size less the
        state: the step state's arrays the call does not read (the unfused projections) are
        pruned from its arguments. ``key``: an array or ShapeDtypeStruct of the key
        :meth:`decode` will get (default: a ``jax.random.PRNGKey``'s). Compiles the very
        executable :meth:`decode` then runs (once; counted in ``compile_s``)."""
        steps = int(steps)
        if steps < 1:
            from nsa_jax.decode import DecodeError
            raise DecodeError(f"steps must be >= 1, got {steps}")
        sds = jax.ShapeDtypeStruct
        if key is None:
            key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
        logits = sds((self.batch, self.model.mcfg.vocab_size), jnp.float32)
        key, done = sds(key.shape, key.dtype), sds((self.batch,), jnp.bool_)
        run = self._decode_exec(logits, key, done, steps=steps, temperature=temperature,
                                top_k=top_k, top_p=top_p, vocab_limit=vocab_limit,
                                eos_id=eos_id, feed_last=feed_last)
        m = run.memory_analysis()
        if m is None:
            return None
        args = tree_bytes((logits, key, done))      # the state and the donated cache: not new
        return int(args + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)
