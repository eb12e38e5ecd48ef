import fcntl
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def random_inputs(seed, B, T, Hq, G, Dk, Dv, cfg, dtype=jnp.float32, scale=1.0):
    """Random NSA inputs (q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates)."""
    Tc = cfg.num_cmp_blocks(T)
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    n = lambda k, s: (scale * jax.random.normal(k, s, jnp.float32)).astype(dtype)
    q = n(ks[0], (B, T, Hq, Dk))
    kc, vc = n(ks[1], (B, Tc, G, Dk)), n(ks[2], (B, Tc, G, Dv))
    k_s, v_s = n(ks[3], (B, T, G, Dk)), n(ks[4], (B, T, G, Dv))
    k_w, v_w = n(ks[5], (B, T, G, Dk)), n(ks[6], (B, T, G, Dv))
    gates = jax.nn.sigmoid(jax.random.normal(ks[7], (B, T, Hq, 3))).astype(dtype)
    return q, kc, vc, k_s, v_s, k_w, v_w, gates


def chunk_inputs(seed, cfg, B, G, h, D, C, S, W, start):
    """A continuation chunk's arguments for ``nsa_chunk_attention`` / ``nsa_chunk_pallas``:
    (q [B,C,G*h,D], the layer's caches lc over S tokens, the window span of W + C tokens, the
    positions t = start + 0..C-1, gates), random float32."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    q = jax.random.normal(ks[0], (B, C, G * h, D))
    Tc = cfg.num_cmp_blocks(S)
    lc = {n: jax.random.normal(k, (B, G, Tc if "cmp" in n else S, D)) for n, k in
          zip(("k_cmp", "v_cmp", "k_slc", "v_slc"), ks[1:5])}
    kw, vw = (jax.random.normal(k, (B, G, W + C, D)) for k in ks[5:7])
    gates = jax.nn.sigmoid(jax.random.normal(ks[7], (B, C, G * h, 3)))
    t = start + jnp.arange(C)
    return q, lc, (kw, vw, start - W + jnp.arange(W + C)), t, gates


ROOT = Path(__file__).resolve().parents[1]


def cli_env(cache_dir) -> dict:
    """Environment for a CLI subprocess: repo on PYTHONPATH, CPU, a shared compile cache (speed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)       # test speed only
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def shared(tmp_path_factory, worker_id, name: str, make):
    """``make(dir)`` once per test session (xdist workers share it through a file lock)."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent
    target = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / f"{name}.done").exists():
            shutil.rmtree(target, ignore_errors=True)
            make(target)
            (root / f"{name}.done").write_text("")
    return target


def kernel_warps(fn, *args, names=None):
    """{Pallas kernel name: its Triton num_warps} in the jaxpr of ``fn(*args)`` (sub-jaxprs
    included): which launch a kernel gets, without compiling it. ``names``: the set of warps of
    those kernels instead (each must be there)."""
    out = {}

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "pallas_call":
                cp = e.params["compiler_params"]
                cp = cp.get("triton", cp) if isinstance(cp, dict) else cp
                out[str(e.params["name"])] = cp.num_warps
            for p in e.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    if names is None:
        return out
    assert set(names) <= set(out), out
    return {out[n] for n in names}


def assert_launch_follows_num_warps(warps, wide):
    """Kernels whose tiles are 64 rows, through ``warps(dtype, head_dim, bs)`` -> the set of warps
    they launch with: ``wide`` (``for_shape`` at bf16 128-wide heads) gives them 4, one warpgroup
    per 64-row tile (8 split each tile's columns between two warpgroups and ran 20-59% slower
    on an H100; bench/NOTES.md, thirtieth session), and they follow ``num_warps``."""
    import dataclasses
    assert warps(jnp.bfloat16, 128, wide) == {4}
    for n in (2, 8):
        assert warps(jnp.bfloat16, 128, dataclasses.replace(wide, num_warps=n)) == {n}


def rrmse(a, b) -> float:
    """Relative RMSE ||a - b|| / ||b|| in float64 (the GPU parity measure); a must be finite."""
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    assert np.isfinite(a).all(), "non-finite values in the kernel result"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))   # a zero reference fails


def fake_hopper(monkeypatch, cc="9.0"):
    """Make ``mosaic_common.default_device`` a GPU of compute capability ``cc`` (CPU tests of the
    Mosaic GPU dispatch and lowering)."""
    import types
    from nsa_jax.pallas import mosaic_common
    dev = types.SimpleNamespace(platform="gpu", compute_capability=cc, device_kind="fake GPU")
    monkeypatch.setattr(mosaic_common, "default_device", lambda: dev)


def lowered_op(cfg, choices, B: int, T: int, Hq: int, G: int, D: int) -> str:
    """The whole Pallas op's forward + backward (bf16) lowered for CUDA, as text: which kernels
    a configuration runs, without a GPU (Triton kernels compiled to their IR by
    ``bench/triton_ir.compiled``)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import triton_ir
    import nsa_jax.pallas.nsa as pnsa
    Tc = cfg.num_cmp_blocks(T)

    def S(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16)

    shapes = [S(B, T, Hq, D), S(B, Tc, G, D), S(B, Tc, G, D)] + [S(B, T, G, D)] * 4 + \
        [S(B, T, Hq, 3)]

    def f(*a):
        o, vjp = jax.vjp(lambda *x: pnsa.nsa_attention_pallas(*x, cfg, choices=choices), *a)
        return o, vjp(o)

    with triton_ir.compiled():
        return jax.jit(f).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


GRAD_NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")


def assert_rrmse_within(errs: dict, bound: float, grads=None, grads_ref=None) -> None:
    """Add the op's 8 input gradients' :func:`rrmse` to ``errs`` (when given), print them all
    (the GPU logs keep the values) and assert each is <= ``bound``."""
    if grads is not None:
        for n, a, b in zip(GRAD_NAMES, grads, grads_ref, strict=True):
            errs[n] = rrmse(a, b)
    print({k: f"{e:.2e}" for k, e in errs.items()})
    bad = {k: e for k, e in errs.items() if not e <= bound}
    assert not bad, f"relative RMSE above {bound:g}: {bad}"


def require_hopper(why_not) -> None:
    """GPU tests of the Mosaic GPU kernels: skip unless jax's first device is a Hopper GPU
    (compute capability 9.x); on one, the kernels' own applicability check (``why_not``, a
    reason or None) must accept the test's shapes, so a regression there fails instead of
    skipping."""
    import pytest
    dev = jax.devices()[0]
    if dev.platform != "gpu" or not str(getattr(dev, "compute_capability", "")).startswith("9"):
        pytest.skip("needs a Hopper GPU")
    assert why_not is None, f"the Mosaic GPU kernels refuse this Hopper GPU's case: {why_not}"


def small_lm():
    """A 1-layer NSA language model over 97 tokens (random weights): the generation tests' model."""
    from nsa_jax.config import ModelConfig
    from nsa_jax.model import build_model
    from nsa_jax.nsa import NSAConfig

    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, init_std=0.3)
    return build_model(mcfg, NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16))
