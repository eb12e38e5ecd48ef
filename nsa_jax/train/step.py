"""The jitted train and eval steps (pure functions of the train state and one global batch).

``train_step(state, batch) -> (state, stats)``: the batch ``[B, T+1]`` is split into
``train.grad_accum`` micro-batches (rows ``a, a+A, a+2A, ...`` form micro-batch ``a``, so every
device contributes to every micro-batch), gradients of the mean next-token loss are averaged
over them with ``lax.scan``, clipped, and AdamW applies them at ``lr_at(step)``. A step whose
loss or gradient norm is not finite leaves parameters and optimizer state unchanged and counts
in ``bad_steps``. The state argument is donated.

Both steps take the data config (``data=``) for one thing: the constant loss mask it asks for
(:func:`loss_mask_for`). ``data.retrieval_loss: answers`` weights only the retrieval layout's
answer targets (``lm_loss(..., loss_mask)`` with the same ``[T]`` mask on every row), so the
train *and* eval losses are the answers' mean cross-entropy; otherwise every target counts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from nsa_jax.config import DataConfig, TrainConfig
from nsa_jax.model import lm_loss
from nsa_jax.parallel import BATCH_AXES, mesh_context
from nsa_jax.train.optim import lr_at
from nsa_jax.train.state import ModelSpec, TrainState


def _global_norm(tree):
    tree_ns = getattr(optax, "tree", None)
    return tree_ns.norm(tree) if hasattr(tree_ns, "norm") else optax.global_norm(tree)


def split_micro(batch, accum: int, mesh=None):
    """[B, L] -> [accum, B/accum, L]; micro-batch a holds rows a, a+accum, ..."""
    B, L = batch.shape
    micro = batch.reshape(B // accum, accum, L).swapaxes(0, 1)
    if mesh is not None:
        micro = jax.lax.with_sharding_constraint(micro, NamedSharding(mesh, P(None, BATCH_AXES)))
    return micro


def under_mesh(fn, mesh):
    """``fn`` traced under ``mesh`` so the attention kernels run per batch shard
    (:mod:`nsa_jax.parallel`); ``fn`` itself when ``mesh`` is None."""
    if mesh is None:
        return fn

    def wrapped(*args):
        with mesh_context(mesh):
            return fn(*args)

    return wrapped


def loss_mask_for(data: DataConfig | None) -> np.ndarray | None:
    """``float32 [seq_len]`` weights over next-token targets that ``data`` asks for, or None
    (every target). ``data.retrieval_loss: answers``: 1 at the retrieval answers only."""
    if data is None or data.retrieval_loss == "all":
        return None
    from nsa_jax.data.retrieval import answer_loss_mask

    return answer_loss_mask(data.seq_len, data.retrieval_queries)


def _loss_fn(spec: ModelSpec, mask: np.ndarray | None):
    """``loss(params, tokens [b, T+1])``: mean next-token loss, weighted by ``mask`` if given."""
    if mask is None:
        return lambda p, toks: lm_loss(spec.model(p), toks)

    def loss(p, toks):
        m = jnp.broadcast_to(jnp.asarray(mask), (toks.shape[0], toks.shape[1] - 1))
        return lm_loss(spec.model(p), toks, m)

    return loss


def loss_and_grads(spec: ModelSpec, params, batch, accum: int, mesh=None,
                   mask: np.ndarray | None = None):
    """Mean loss and its gradient over ``accum`` micro-batches of ``batch`` (every micro-batch
    has the same number of weighted targets, so the mean of their means is the batch mean)."""
    grad_fn = jax.value_and_grad(_loss_fn(spec, mask))
    if accum == 1:
        return grad_fn(params, batch)

    def body(carry, toks):
        loss_sum, g_sum = carry
        loss, g = grad_fn(params, toks)
        return (loss_sum + loss, jax.tree.map(jnp.add, g_sum, g)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros),
                                    split_micro(batch, accum, mesh))
    return loss / accum, jax.tree.map(lambda g: g / accum, grads)


def make_train_step(spec: ModelSpec, tcfg: TrainConfig, tx, mesh=None,
                    data: DataConfig | None = None):
    mask = loss_mask_for(data)

    def train_step(state: TrainState, batch):
        loss, grads = loss_and_grads(spec, state.params, batch, tcfg.grad_accum, mesh, mask)
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
    """``eval_step(params, batch) -> mean loss`` (same micro-batching and loss mask as
    training)."""
    loss_fn = _loss_fn(spec, loss_mask_for(data))

    def eval_step(params, batch):
        if accum == 1:
            return loss_fn(params, batch)

        def body(total, toks):
            return total + loss_fn(params, toks), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), split_micro(batch, accum, mesh))
        return total / accum

    return under_mesh(eval_step, mesh)
