"""The jitted train and eval steps (pure functions of the train state and one global batch).

``train_step(state, batch) -> (state, stats)``: the batch (a :class:`~nsa_jax.data.batch.Batch`
from the loader: ``tokens [B, T+1]``, and ``loss_mask [B, T]`` / ``segment_ids [B, T+1]`` when the
data config asks for them; a bare token array is a Batch of tokens only) is split into
``train.grad_accum`` micro-batches (rows ``a, a+A, a+2A, ...`` form micro-batch ``a``, so every
device contributes to every micro-batch), gradients of the mean next-token loss
(``lm_loss(model, tokens, loss_mask, segment_ids)``) are averaged over them with ``lax.scan``,
clipped, and AdamW applies them at ``lr_at(step)``. A step whose loss or gradient norm is not
finite leaves parameters and optimizer state unchanged and counts in ``bad_steps``. The state
argument is donated.

What the loss counts comes with the batch: ``data.retrieval.loss: answers`` puts the answers'
mask in ``loss_mask`` (the train *and* eval losses are the answers' mean cross-entropy);
``data.packing: documents`` puts ``segment_ids`` (each document its own sequence, targets across
a boundary dropped). With segment ids the micro-batches count different numbers of targets, so
their losses and gradients are weighted by those counts: the step's loss is the batch's mean
over its counted targets, as with one micro-batch. ``data=`` (the data config), when given,
checks at trace time that the batch has the fields that config yields.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from nsa_jax.config import DataConfig, TrainConfig
from nsa_jax.data.batch import Batch, batch_fields
from nsa_jax.model import lm_loss
from nsa_jax.parallel import BATCH_AXES, mesh_context
from nsa_jax.train.optim import lr_at
from nsa_jax.train.state import ModelSpec, TrainState


def _global_norm(tree):
    tree_ns = getattr(optax, "tree", None)
    return tree_ns.norm(tree) if hasattr(tree_ns, "norm") else optax.global_norm(tree)


def split_micro(batch, accum: int, mesh=None):
    """Each [B, L] array of ``batch`` (an array or a Batch) -> [accum, B/accum, L]; micro-batch
    a holds rows a, a+accum, ..."""
    def split(x):
        B = x.shape[0]
        micro = x.reshape(B // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        if mesh is not None:
            micro = jax.lax.with_sharding_constraint(micro, NamedSharding(mesh, P(None, BATCH_AXES)))
        return micro

    return jax.tree.map(split, batch)


def under_mesh(fn, mesh):
    """``fn`` traced under ``mesh`` so the attention kernels run per batch shard
    (:mod:`nsa_jax.parallel`); ``fn`` itself when ``mesh`` is None."""
    if mesh is None:
        return fn

    def wrapped(*args):
        with mesh_context(mesh):
            return fn(*args)

    return wrapped


def batch_struct(data: DataConfig, rows: int, sharding=None) -> Batch:
    """The abstract global batch (``jax.ShapeDtypeStruct`` per field) the loader of ``data``
    yields, ``rows`` rows, for lowering the step ahead of the first batch."""
    return Batch(*(None if f is None else jax.ShapeDtypeStruct(f[0], f[1], sharding=sharding)
                   for f in batch_fields(data, rows)))


def as_step_batch(batch, data: DataConfig | None = None) -> Batch:
    """``batch`` as a Batch (a bare token array is one of tokens only); with ``data``, a
    ValueError unless it has exactly the fields ``data``'s loader yields (trace time)."""
    b = batch if isinstance(batch, Batch) else Batch(batch)
    if data is not None:
        want = batch_fields(data, b.tokens.shape[0])
        for name in ("loss_mask", "segment_ids"):
            if (getattr(b, name) is None) != (getattr(want, name) is None):
                raise ValueError(f"batch.{name}: the data config (data.source={data.source}, "
                                 f"data.packing={data.packing}, data.retrieval.loss="
                                 f"{data.retrieval.loss}) "
                                 + ("yields it, but the batch has none" if getattr(b, name) is None
                                    else "yields none, but the batch has it"))
    return b


def _loss_fn(spec: ModelSpec):
    """``loss(params, batch)``: mean next-token loss over the batch's counted targets."""
    return lambda p, b: lm_loss(spec.model(p), b.tokens, b.loss_mask, b.segment_ids)


def _counted(b: Batch):
    """Targets ``lm_loss`` counts in ``b`` (float32), or None when every micro-batch counts
    equally many (no segment ids)."""
    if b.segment_ids is None:
        return None
    w = (b.segment_ids[:, 1:] == b.segment_ids[:, :-1]).astype(jnp.float32)
    return jnp.sum(w if b.loss_mask is None else w * b.loss_mask)


def loss_and_grads(spec: ModelSpec, params, batch, accum: int, mesh=None):
    """Mean loss and its gradient over ``accum`` micro-batches of ``batch`` (a Batch or a token
    array): the mean of their means where every micro-batch counts equally many targets, else
    weighted by their counts (module docstring)."""
    b = as_step_batch(batch)
    grad_fn = jax.value_and_grad(_loss_fn(spec))
    if accum == 1:
        return grad_fn(params, b)
    weighted = b.segment_ids is not None

    def body(carry, mb):
        loss_sum, g_sum, n_sum = carry
        loss, g = grad_fn(params, mb)
        n = _counted(mb) if weighted else jnp.ones((), jnp.float32)
        return (loss_sum + n * loss, jax.tree.map(lambda a, x: a + n * x, g_sum, g)
                if weighted else jax.tree.map(jnp.add, g_sum, g), n_sum + n), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    zero = jnp.zeros((), jnp.float32)
    (loss, grads, n), _ = jax.lax.scan(body, (zero, zeros, zero), split_micro(b, accum, mesh))
    n = jnp.maximum(n, 1.0) if weighted else accum
    return loss / n, jax.tree.map(lambda g: g / n, grads)


def make_train_step(spec: ModelSpec, tcfg: TrainConfig, tx, mesh=None,
                    data: DataConfig | None = None):
    def train_step(state: TrainState, batch):
        batch = as_step_batch(batch, data)
        loss, grads = loss_and_grads(spec, state.params, batch, tcfg.grad_accum, mesh)
        grad_norm = _global_norm(grads)
        lr = lr_at(state.step, tcfg)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, jax.tree.map(lambda u: lr * u, updates))
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def keep(new, old):
            return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)

        rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0])
        bad = jnp.where(ok, 0, state.bad_steps + 1).astype(jnp.int32)
        new = TrainState(step=state.step + 1, params=keep(params, state.params),
                         opt_state=keep(opt_state, state.opt_state), rng=rng, bad_steps=bad,
                         skipped=state.skipped + (~ok).astype(jnp.int32))
        stats = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "bad_steps": bad,
                 "skipped": new.skipped}
        return new, stats

    return under_mesh(train_step, mesh)


def make_eval_step(spec: ModelSpec, accum: int, mesh=None, data: DataConfig | None = None):
    """``eval_step(params, batch) -> mean loss`` (same micro-batching and weighting as
    training)."""
    loss_fn = _loss_fn(spec)

    def eval_step(params, batch):
        b = as_step_batch(batch, data)
        if accum == 1:
            return loss_fn(params, b)
        weighted = b.segment_ids is not None

        def body(carry, mb):
            total, n_sum = carry
            n = _counted(mb) if weighted else jnp.ones((), jnp.float32)
            return (total + n * loss_fn(params, mb), n_sum + n), None

        zero = jnp.zeros((), jnp.float32)
        (total, n), _ = jax.lax.scan(body, (zero, zero), split_micro(b, accum, mesh))
        return total / (jnp.maximum(n, 1.0) if weighted else accum)

    return under_mesh(eval_step, mesh)
