"""Data parallelism and FSDP on 2 host devices: same training numbers as one device, the state
split as ``mesh.fsdp`` asks, and the attention kernels run per batch shard (nsa_jax.parallel).

The 2-device cases run in one subprocess (the host device count is fixed when jax starts)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from jax.sharding import PartitionSpec as P

from nsa_jax.train.mesh import leaf_spec
from nsa_testutil import ROOT, cli_env

SCRIPT = r'''
import json, os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
from nsa_jax.config import load_config
from nsa_jax.parallel import batch_parallel, mesh_context
from nsa_jax.train import mesh as meshlib
from nsa_jax.train.optim import make_optimizer
from nsa_jax.train.state import ModelSpec, init_state
from nsa_jax.train.step import make_train_step

out = {"devices": jax.device_count()}
SMALL = ["data.source=synthetic", "data.seq_len=64", "model.vocab_size=256", "model.dim=64",
         "model.n_layers=1", "model.n_heads=2", "model.n_kv_groups=1", "model.head_dim=32",
         "model.mlp_hidden=128", "nsa.block_l=16", "nsa.stride_d=8", "nsa.sel_block=16",
         "nsa.n_sel=3", "nsa.window=32", "train.batch_size=4", "train.warmup_steps=1",
         "train.lr=3e-3", "model.compute_dtype=float32"]

# batch_parallel: each device's function sees its own rows only
seen = []
def per_shard(x):
    seen.append(x.shape)
    return x * 2.0 + 1.0
mesh = meshlib.build_mesh(load_config("configs/tiny.yaml", SMALL).mesh)
xs = jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3)
bsh = meshlib.batch_sharding(mesh)
with mesh_context(mesh):
    y = jax.jit(lambda x: batch_parallel(per_shard, x), in_shardings=bsh, out_shardings=bsh)(xs)
out["shard_shapes"] = [list(s) for s in seen]
out["shard_ok"] = bool(jnp.array_equal(y, xs * 2.0 + 1.0))

# The step-0 state (one device), made once: every run starts from it (exec.nsa_impl and the
# mesh do not change it; test speed: one init compile, not five).
INIT = []

def run(extra, devices):
    cfg = load_config("configs/tiny.yaml", SMALL + extra)
    spec = ModelSpec(cfg.model, cfg.nsa, cfg.train.seed, cfg.exec)
    tx = make_optimizer(cfg.train)
    rows = np.random.default_rng(0).integers(0, 256, (3, 4, 65)).astype(np.int32)
    if not INIT:
        INIT.append(jax.jit(lambda: init_state(spec, tx, 0))())
    if devices == 1:
        state = INIT[0]
        step = jax.jit(make_train_step(spec, cfg.train, tx))
        batches = [jnp.asarray(r) for r in rows]
        specs = None
    else:
        mesh = meshlib.build_mesh(cfg.mesh)
        abstract = jax.eval_shape(lambda: init_state(spec, tx, 0))
        sh = meshlib.state_shardings(mesh, abstract)
        bsh = meshlib.batch_sharding(mesh)
        state = jax.device_put(INIT[0], sh)      # placed as state_shardings asks
        step = jax.jit(make_train_step(spec, cfg.train, tx, mesh), in_shardings=(sh, bsh),
                       out_shardings=(sh, None))
        batches = [meshlib.place_batch(r, bsh, 4) for r in rows]
        emb = state.params["embed"]["embedding"]
        specs = {"embed": str(emb.sharding.spec),
                 "opt_like_embed": sorted({str(x.sharding.spec) for x in
                                           jax.tree.leaves(state.opt_state)
                                           if x.shape == emb.shape}),
                 "n_opt_like_embed": sum(x.shape == emb.shape
                                         for x in jax.tree.leaves(state.opt_state))}
    losses, norms = [], []
    for b in batches:
        state, stats = step(state, b)
        losses.append(float(stats["loss"]))
        norms.append(float(stats["grad_norm"]))
    return losses, norms, specs

LAYOUTS = {"data": ["mesh.data=2"], "fsdp": ["mesh.data=1", "mesh.fsdp=2"]}
for impl, layouts in (("reference", ("data", "fsdp")), ("pallas", ("fsdp",))):
    losses, norms, _ = run([f"exec.nsa_impl={impl}"], 1)
    res = {"one": losses, "one_norm": norms}
    for name in layouts:
        losses, norms, specs = run([f"exec.nsa_impl={impl}", *LAYOUTS[name]], 2)
        res[name], res[name + "_norm"], res[name + "_specs"] = losses, norms, specs
    out[impl] = res
print("RESULT " + json.dumps(out))
'''


def test_leaf_spec_rule():
    assert leaf_spec((50304, 768), 2) == P("fsdp")            # largest dim first
    assert leaf_spec((768, 2304), 2) == P(None, "fsdp")
    assert leaf_spec((768, 2304), 1) == P()                   # fsdp 1: replicated
    assert leaf_spec((768,), 2) == P()                        # too small
    assert leaf_spec((), 2) == P()
    assert leaf_spec((1023, 129), 2) == P()                   # nothing divides
    assert leaf_spec((1023, 256), 4) == P(None, "fsdp")       # the dim that fits
    assert leaf_spec((256, 256), 2) == P("fsdp")              # ties: the first


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """The two-device subprocess's results, computed once per test session: pytest-xdist
    workers share them through a file under the session's common temp root (a lock makes the
    second worker wait for the first instead of running the same ~1 min subprocess again)."""
    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp().parent / "two_devices.json"
    with FileLock(str(shared) + ".lock"):
        if shared.is_file():
            return json.loads(shared.read_text())
        env = cli_env("")
        # no persistent compilation cache: every program of SCRIPT compiles once, and writing
        # them all to a cache nothing reads again cost ~15% of the run
        for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
            env.pop(key)
        r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        shared.write_text(line[len("RESULT "):])
        return json.loads(line[len("RESULT "):])


def test_batch_parallel_runs_per_shard(two_devices):
    assert two_devices["devices"] == 2
    assert two_devices["shard_shapes"] == [[2, 3]] and two_devices["shard_ok"]


@pytest.mark.parametrize("impl,layout", [("reference", "data"), ("reference", "fsdp"),
                                         ("pallas", "fsdp")])
def test_two_devices_match_one(two_devices, impl, layout):
    """3 AdamW steps in float32: loss and gradient norm of every step equal to one device's up
    to summation order (the pallas case runs the interpreted kernels inside shard_map)."""
    res = two_devices[impl]
    assert len(res["one"]) == 3 and res["one"][2] < res["one"][0]
    for key in ("", "_norm"):
        for a, b in zip(res["one" + key], res[layout + key]):
            assert abs(a - b) <= 1e-5 * abs(a), (key, res["one" + key], res[layout + key])


def test_fsdp_splits_params_and_adam_moments(two_devices):
    for res in (two_devices["reference"], two_devices["pallas"]):
        assert res["fsdp_specs"]["embed"] == str(P("fsdp"))          # [256, 64]: vocab split
        assert res["fsdp_specs"]["n_opt_like_embed"] == 2            # Adam mu and nu ...
        assert res["fsdp_specs"]["opt_like_embed"] == [str(P("fsdp"))]   # ... split like it
    assert two_devices["reference"]["data_specs"]["embed"] == str(P())   # data parallel: replicated
