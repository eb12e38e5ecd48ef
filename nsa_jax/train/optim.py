"""Optimizer: AdamW (decoupled weight decay) with global-norm clipping and a warmup-cosine LR.

* Learning rate (``lr_at``): linear warmup over ``train.warmup_steps`` updates to ``train.lr``,
  then cosine decay to ``train.min_lr_ratio * train.lr`` at the last update.
* Clipping: ``optax.clip_by_global_norm(train.grad_clip)`` (``grad_clip <= 0`` turns it off).
* Weight decay only on matrices that are not embeddings (``decay_mask``), unless
  ``train.decay_norms_biases_embeddings``.

The transformation is ``optax.adamw`` with learning rate 1; the train step multiplies its update
by ``lr_at(step)``. That is exactly AdamW (whose update is ``-lr * (adam + wd * p)``) with the
schedule driven by the train step counter, which also counts skipped (non-finite) steps, so the
logged ``lr`` is the one applied.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from nsa_jax.config import TrainConfig

# Parameter-path names that mark an embedding table (token embedding, φ's intra-block positions).
EMBEDDING_NAMES = frozenset({"embed", "embedding", "pos_emb"})
NO_DECAY_LEAF_NAMES = frozenset({"bias", "scale"})


def lr_at(step, tcfg: TrainConfig):
    """Learning rate of update number ``step`` (0-based; jnp scalar or int)."""
    step = jnp.asarray(step, jnp.float32)
    peak = tcfg.lr
    low = tcfg.lr * tcfg.min_lr_ratio
    w = float(tcfg.warmup_steps)
    warm = peak * (step + 1.0) / max(w, 1.0)
    span = max(float(tcfg.steps) - w - 1.0, 1.0)
    frac = jnp.clip((step - w) / span, 0.0, 1.0)
    cos = low + (peak - low) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
    return jnp.where(step < w, warm, cos)


def path_names(path) -> list[str]:
    """The names along a pytree key path (dict keys, attribute names, sequence indices)."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return out


def path_str(path) -> str:
    """``a/b/0/c`` form of a pytree key path."""
    return "/".join(path_names(path))


def decays(path, leaf, include_all: bool = False) -> bool:
    """Whether the parameter at ``path`` gets weight decay: matrices, except embedding tables."""
    if include_all:
        return True
    names = path_names(path)
    if leaf.ndim < 2 or (names and names[-1] in NO_DECAY_LEAF_NAMES):
        return False
    return not any(n in EMBEDDING_NAMES for n in names)


def decay_mask(params, include_all: bool = False):
    """Pytree of bools like ``params``: True where weight decay applies."""
    return jax.tree_util.tree_map_with_path(lambda p, x: decays(p, x, include_all), params)


def make_optimizer(tcfg: TrainConfig) -> optax.GradientTransformation:
    """Clip -> AdamW(lr=1, masked decay). Scale the result by ``lr_at(step)``."""
    parts = []
    if tcfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(tcfg.grad_clip))
    parts.append(optax.adamw(learning_rate=1.0, b1=tcfg.beta1, b2=tcfg.beta2, eps=tcfg.eps,
                             weight_decay=tcfg.weight_decay,
                             mask=lambda p: decay_mask(p, tcfg.decay_norms_biases_embeddings)))
    return optax.chain(*parts)
