"""The train state as plain pytrees, and the bridge between pure parameter dicts and ``NSALM``.

Parameters travel as a nested dict of arrays (``nnx.to_pure_dict`` of the model's ``nnx.Param``
state): the optimizer state, the checkpoint and the weight-decay mask all follow that structure.
:class:`ModelSpec` holds the model's static ``graphdef`` and rebuilds an ``NSALM`` from such a
dict (inside or outside ``jit``) with :meth:`ModelSpec.model`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from nsa_jax.config import ExecConfig, ModelConfig
from nsa_jax.model import build_model
from nsa_jax.nsa import NSAConfig


class TrainState(NamedTuple):
    step: jax.Array          # int32 []: optimizer updates done
    params: Any              # nested dict of float32 arrays
    opt_state: Any           # optax state shaped like params
    rng: jax.Array           # uint32 [2]: RNG key data, advanced every step (the current model
                             # is deterministic, so nothing consumes it yet)
    bad_steps: jax.Array     # int32 []: consecutive steps skipped for non-finite loss/grads
    skipped: jax.Array       # int32 []: all steps skipped so far


class ModelSpec:
    """Static description of one model: graphdef, abstract parameters, init and rebuild."""

    def __init__(self, mcfg: ModelConfig, ncfg: NSAConfig, seed: int = 0,
                 xcfg: ExecConfig | None = None):
        self.mcfg, self.ncfg, self.seed, self.xcfg = mcfg, ncfg, seed, xcfg
        abstract = nnx.eval_shape(lambda: build_model(mcfg, ncfg, seed, xcfg))
        self.graphdef, self._abstract_state, rest = nnx.split(abstract, nnx.Param, ...)
        if jax.tree.leaves(rest):
            raise TypeError("NSALM has non-Param variables; the trainer only carries nnx.Param")
        self.abstract_params = nnx.to_pure_dict(self._abstract_state)

    def init_params(self):
        """Fresh parameters (call under ``jax.jit`` with ``out_shardings`` to place them)."""
        model = build_model(self.mcfg, self.ncfg, self.seed, self.xcfg)
        return nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1])

    def model(self, params):
        """An ``NSALM`` whose parameters are the arrays of the pure dict ``params``."""
        state = jax.tree.map(lambda x: x, self._abstract_state)   # fresh container
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)


def new_rng(seed: int) -> jax.Array:
    return jax.random.key_data(jax.random.key(seed))


def init_state(spec: ModelSpec, tx, seed: int, params=None) -> TrainState:
    """Pure function (jit it with out_shardings): step 0 state, from fresh parameters or from
    ``params`` (``train.init_from``: the weights of another run, a fresh optimizer)."""
    params = spec.init_params() if params is None else params
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=params, opt_state=tx.init(params), rng=new_rng(seed),
                      bad_steps=zero, skipped=zero)


def abstract_state(spec: ModelSpec, tx, seed: int) -> TrainState:
    return jax.eval_shape(lambda: init_state(spec, tx, seed))
