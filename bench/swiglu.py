"""The 125M MLP (``w_in`` -> SwiGLU gate -> ``w_out``) timed with jax's autodiff of the plain gate,
with ``nsa_jax.swiglu``'s custom VJP (select + reverse, no concatenate) and with the same
math ending in a concatenate (``concat_vjp``, bench only), in one process on the same inputs.

    PYTHONPATH=. python bench/swiglu.py [--tokens 65536 32768] [--reps 30] [--out F]

Per token count: wall ms (median, ``kernels.timed``) of the gate's backward alone (du from u and
dh) and of the MLP's forward + backward (bf16, dim 768, hidden 2048), the byte floor of the gate's
backward at the given HBM bandwidth (read u and dh, write du), and from the optimised HLO of the
backward the number of fusions and of concatenates (gate alone and whole MLP). Each variant's
output and gradients are compared with the float32 MLP on the same (bf16-valued) inputs: relative
RMSE recorded, the script fails above 2e-2 (a wrong formula, not rounding).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kernels import timed  # noqa: E402

from nsa_jax.swiglu import swiglu  # noqa: E402


def plain(u):
    a, b = jnp.split(u, 2, axis=-1)
    return jax.nn.silu(a) * b


@jax.custom_vjp
def concat_vjp(u):
    """A candidate formulation (bench only): the same float32 math as ``swiglu``'s backward,
    written as two [T, H] halves joined by a concatenate (what jax's autodiff also ends in)."""
    return plain(u)


def _concat_fwd(u):
    return plain(u), u


def _concat_bwd(u, dh):
    a, b = jnp.split(u.astype(jnp.float32), 2, axis=-1)
    s, d = jax.nn.sigmoid(a), dh.astype(jnp.float32)
    return (jnp.concatenate([d * b * s * (1.0 + a * (1.0 - s)), d * a * s], -1).astype(u.dtype),)


concat_vjp.defvjp(_concat_fwd, _concat_bwd)


@jax.custom_vjp
def two_sigmoid_vjp(u):
    """A candidate formulation (bench only; the product's first version, a460684): the same
    select over [T, 2, H] with both candidate expressions evaluated on every element (two
    sigmoids per element)."""
    return plain(u)


def _two_fwd(u):
    return plain(u), u


def _two_bwd(u, dh):
    H = u.shape[-1] // 2
    own = u.reshape(*u.shape[:-1], 2, H).astype(jnp.float32)
    partner = jnp.flip(own, axis=-2)
    first = jax.lax.broadcasted_iota(jnp.int32, own.shape, own.ndim - 2) == 0
    d = dh.astype(jnp.float32)[..., None, :]
    s_own, s_partner = jax.nn.sigmoid(own), jax.nn.sigmoid(partner)
    du = jnp.where(first, d * partner * s_own * (1.0 + own * (1.0 - s_own)),
                   d * partner * s_partner)
    return (du.reshape(u.shape).astype(u.dtype),)


two_sigmoid_vjp.defvjp(_two_fwd, _two_bwd)
VARIANTS = {"autodiff": plain, "custom_vjp": swiglu, "concat_vjp": concat_vjp,
            "two_sigmoid_vjp": two_sigmoid_vjp}


def mlp_grads(act, x, w1, w2, dy):
    y, vjp = jax.vjp(lambda x, w1, w2: act(x @ w1) @ w2, x, w1, w2)
    return (y,) + vjp(dy)


def hlo_counts(fn, *args):
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return {"fusions": hlo.count(" fusion("), "concatenates": hlo.count(" concatenate(")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[65536, 32768])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--hbm-tbs", type=float, default=4.3, help="HBM TB/s for the floor")
    p.add_argument("--out")
    a = p.parse_args(argv)
    dt = jnp.bfloat16
    rows = []
    for T in a.tokens:
        ks = jax.random.split(jax.random.PRNGKey(T), 5)
        x = jax.random.normal(ks[0], (T, a.dim), dt)
        w1 = (jax.random.normal(ks[1], (a.dim, 2 * a.hidden)) * 0.03).astype(dt)
        w2 = (jax.random.normal(ks[2], (a.hidden, a.dim)) * 0.03).astype(dt)
        u = (x @ w1)
        dh = jax.random.normal(ks[3], (T, a.hidden), dt)
        dy = jax.random.normal(ks[4], (T, a.dim), dt)
        floor_ms = (2 * u.size + dh.size + 2 * u.size) * 2 / (a.hbm_tbs * 1e12) * 1e3
        f32 = [t.astype(jnp.float32) for t in (x, w1, w2, dy)]
        ref = jax.jit(lambda x, w1, w2, dy: mlp_grads(plain, x, w1, w2, dy))(*f32)
        for name, act in VARIANTS.items():
            def gate_bwd(u, dh, act=act):
                return jax.vjp(act, u)[1](dh)[0]

            def mlp(x, w1, w2, dy, act=act):
                return mlp_grads(act, x, w1, w2, dy)

            gate_ms = timed(jax.jit(gate_bwd), [(u, dh)], a.reps)
            mlp_ms = timed(jax.jit(mlp), [(x, w1, w2, dy)], a.reps)
            out = jax.jit(mlp)(x, w1, w2, dy)
            errs = {}
            for got, want, what in zip(out, ref, ("y", "dx", "dw_in", "dw_out")):
                g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
                errs[what] = float(np.sqrt(np.mean((g - w) ** 2) / max(np.mean(w ** 2), 1e-30)))
            if max(errs.values()) > 2e-2:
                raise SystemExit(f"{name}: far from the float32 MLP: {errs}")
            mlp_hlo = hlo_counts(mlp, x, w1, w2, dy)
            row = {"tokens": T, "variant": name, "rel_rmse_vs_f32": errs, "gate_bwd_ms": gate_ms, "mlp_fwd_bwd_ms": mlp_ms,
                   "gate_bwd_floor_ms": floor_ms, **hlo_counts(gate_bwd, u, dh),
                   "mlp_fusions": mlp_hlo["fusions"], "mlp_concatenates": mlp_hlo["concatenates"],
                   "device": jax.devices()[0].device_kind, "jax": jax.__version__}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    print(f"{'tokens':>7} {'variant':>11} {'gate bwd ms':>12} {'floor':>7} {'MLP f+b ms':>11} "
          f"{'fusions':>8} {'concats':>8} {'MLP fus':>8} {'MLP cat':>8}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['variant']:>11} {r['gate_bwd_ms']:>12.3f} "
              f"{r['gate_bwd_floor_ms']:>7.3f} {r['mlp_fwd_bwd_ms']:>11.3f} {r['fusions']:>8} "
              f"{r['concatenates']:>8} {r['mlp_fusions']:>8} {r['mlp_concatenates']:>8}")


if __name__ == "__main__":
    main()
