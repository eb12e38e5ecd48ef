"""The jitted train and eval steps (pure functions of the train state and one global batch).

``train_step(state, batch) -> (state, stats)``: the batch ``[B, T+1]`` is split into
``train.grad_accum`` micro-batches (rows ``a, a+A, a+2A, ...`` form micro-batch ``a``, so every
device contributes to every micro-batch), gradients of the mean next-token loss are averaged
over them with ``lax.scan``, clipped, and AdamW applies them at ``lr_at(step)``. A step whose
loss or gradient norm is not finite leaves parameters and optimizer state unchanged and counts
in ``bad_steps``. The state argument is donated.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from nsa_jax.config import TrainConfig
from nsa_jax.model import lm_loss
from nsa_jax.train.mesh import BATCH_AXES
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


def loss_and_grads(spec: ModelSpec, params, batch, accum: int, mesh=None):
    """Mean loss and its gradient over ``accum`` micro-batches of ``batch``."""
    grad_fn = jax.value_and_grad(lambda p, toks: lm_loss(spec.model(p), toks))
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


def make_train_step(spec: ModelSpec, tcfg: TrainConfig, tx, mesh=None):
    def train_step(state: TrainState, batch):
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

    return train_step


def make_eval_step(spec: ModelSpec, accum: int, mesh=None):
    """``eval_step(params, batch) -> mean loss`` (same micro-batching as training)."""
    def eval_step(params, batch):
        if accum == 1:
            return lm_loss(spec.model(params), batch)

        def body(total, toks):
            return total + lm_loss(spec.model(params), toks), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), split_micro(batch, accum, mesh))
        return total / accum

    return eval_step
