"""Training system: loop outputs, optimizer, grad accumulation, resume after kill -9, errors.

Tiny NSA models on synthetic data (CPU). Subprocess runs share a JAX compilation cache in a
temporary directory so the three runs of the kill/resume test compile once.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nsa_jax.config import load_config
from nsa_jax.train.cli import main
from nsa_jax.train.metrics import MetricsLog, read_metrics
from nsa_testutil import cli_env
from test_faults import DRIVER

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
SMALL = ["data.source=synthetic", "data.path=null", "data.seq_len=64", "data.prefetch=1",
         "model.vocab_size=256", "model.dim=64", "model.n_layers=1", "model.n_heads=2",
         "model.n_kv_groups=1", "model.head_dim=32", "model.mlp_hidden=128",
         "nsa.block_l=16", "nsa.stride_d=8", "nsa.sel_block=16", "nsa.n_sel=3", "nsa.window=32",
         "train.batch_size=4", "train.warmup_steps=4", "train.lr=3e-3", "train.eval_batches=2"]


def small_cfg(*extra):
    return load_config(TINY, SMALL + list(extra))


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jax_cache")


def cli(args, cache_dir, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsa_jax.train", *args], cwd=ROOT,
                          env=cli_env(cache_dir), capture_output=True, text=True, timeout=timeout)


def tree_digest(path: Path) -> dict:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# ---- one short training run shared by several tests -------------------------------------------
TINY_RUN = ["train.steps=24", "train.log_every=4", "train.eval_every=12", "train.ckpt_every=12",
            "train.ckpt_keep=2", "train.profile_steps=[5,6]"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, worker_id):
    """Train once per test session (pytest-xdist workers share it through a file lock)."""
    import fcntl

    from nsa_jax.train.loop import train

    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":          # the session's directory, shared by the workers
        root = root.parent
    run_dir = root / "tiny_run"
    cfg = small_cfg(*TINY_RUN, f"run.dir={run_dir}")
    with open(root / "tiny_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "tiny_run.json"
        if not done.exists():
            done.write_text(json.dumps(train(cfg)))
        summary = json.loads(done.read_text())
    return run_dir, cfg, summary


def test_loss_falls_and_metrics_keys(tiny_run):
    run_dir, cfg, summary = tiny_run
    entries = read_metrics(run_dir / "metrics.jsonl")
    train_e = [e for e in entries if "loss" in e]
    eval_e = [e for e in entries if "eval_loss" in e]
    assert [e["step"] for e in train_e] == [4, 8, 12, 16, 20, 24]
    assert [e["step"] for e in eval_e] == [12, 24]
    for e in train_e:
        assert {"step", "loss", "loss_avg", "lr", "grad_norm", "tokens_per_s", "tokens_seen",
                "elapsed_s"} <= set(e)
        assert e["tokens_seen"] == e["step"] * 4 * 64
        assert e["tokens_per_s"] > 0 and math.isfinite(e["grad_norm"])
    assert train_e[-1]["loss"] < train_e[0]["loss"] - 0.3
    assert train_e[-1]["loss_avg"] < train_e[0]["loss_avg"] - 0.3
    assert eval_e[-1]["eval_loss"] < math.log(256) - 0.3
    assert eval_e[-1]["eval_loss"] < eval_e[0]["eval_loss"]
    assert summary["step"] == 24
    # the resolved config and env.json are written
    saved = load_config(run_dir / "config.yaml")
    assert saved.run.dir == str(run_dir) and saved.model == cfg.model
    env = json.loads((run_dir / "env.json").read_text())
    assert env["versions"]["jax"] == jax.__version__ and env["device_count"] == 1
    assert {"jaxlib", "flax", "optax", "orbax-checkpoint"} <= set(env["versions"])
    assert env["host"] and "git" in env


def test_tensorboard_checkpoints_profile(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = tiny_run
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "train/lr", "eval/eval_loss"} <= set(acc.Tags()["scalars"])
    losses = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    logged = [(e["step"], e["loss"]) for e in read_metrics(run_dir / "metrics.jsonl") if "loss" in e]
    assert [s for s, _ in losses] == [s for s, _ in logged]
    np.testing.assert_allclose([v for _, v in losses], [v for _, v in logged], rtol=1e-6)
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [12, 24]
    traces = list((run_dir / "profile").rglob("*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0
    assert list((run_dir / "profile").rglob("perfetto_trace.json.gz"))


def test_load_for_inference_round_trip(tiny_run):
    """The loaded model reproduces the eval loss the trainer logged at its last step."""
    from nsa_jax.data import build_loader
    from nsa_jax.model import NSALM, lm_loss
    from nsa_jax.train import load_for_inference

    run_dir, cfg, _ = tiny_run
    cfg2, model = load_for_inference(run_dir)
    assert isinstance(model, NSALM) and cfg2.model == cfg.model and cfg2.nsa == cfg.nsa
    loader = build_loader(cfg2, "eval", batch_size=cfg.train.batch_size)
    try:
        loss_fn = jax.jit(lambda m, b: lm_loss(m, b))
        losses = [float(loss_fn(model, jnp.asarray(next(loader).tokens)))
                  for _ in range(cfg.train.eval_batches)]
    finally:
        loader.close()
    logged = [e for e in read_metrics(run_dir / "metrics.jsonl") if "eval_loss" in e][-1]
    assert logged["step"] == 24
    np.testing.assert_allclose(np.mean(losses), logged["eval_loss"], rtol=1e-5)
    _, model12 = load_for_inference(run_dir, step=12)
    assert not np.array_equal(np.asarray(model12.embed.embedding[...]),
                              np.asarray(model.embed.embedding[...]))


def test_load_for_inference_errors(tmp_path, tiny_run):
    from nsa_jax.train import CheckpointError, load_for_inference

    with pytest.raises(CheckpointError, match="run directory not found"):
        load_for_inference(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.yaml"):
        load_for_inference(tmp_path / "empty")
    run_dir, _, _ = tiny_run
    bad = tmp_path / "bad"
    bad.mkdir()
    text = (run_dir / "config.yaml").read_text().replace("dim: 64", "dim: 96")
    (bad / "config.yaml").write_text(text)
    with pytest.raises(CheckpointError, match="checkpoints"):
        load_for_inference(bad)
    (bad / "checkpoints").symlink_to(run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match=r"checkpoints/24/params: blocks/0/.* is "
                                              r"float32\[64, .*needs float32\[96, "):
        load_for_inference(bad)


# ---- error cases: one line on stderr, exit 2, checkpoints untouched ----------------------------
def run_main(capsys, args):
    code = main(args)
    out = capsys.readouterr()
    return code, out.err


def assert_one_error(code, err, *needles):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_error_cases_exit_2(tmp_path, capsys, tiny_run):
    run_dir, _, _ = tiny_run
    before = tree_digest(run_dir / "checkpoints")
    base = ["--config", TINY, *SMALL, "train.steps=30"]

    assert_one_error(*run_main(capsys, base + ["train.stepz=3"]), "train.stepz")
    assert_one_error(*run_main(capsys, base + ["train.steps=abc"]), "train.steps")
    assert_one_error(*run_main(capsys, ["--config", str(tmp_path / "no.yaml")]), "no.yaml")
    assert_one_error(*run_main(capsys, base + ["data.source=text",
                                               f"data.path={tmp_path / 'missing.jsonl'}",
                                               "data.tokenizer=byte"]),
                     "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    assert_one_error(*run_main(capsys, base + ["data.source=text", f"data.path={empty}",
                                               "data.tokenizer=byte"]), "empty")
    assert_one_error(*run_main(capsys, base + ["mesh.fsdp=2"]), "mesh.fsdp")
    assert_one_error(*run_main(capsys, base + ["run.resume=true"]), "run.resume")
    (tmp_path / "afile").write_text("x")
    assert_one_error(*run_main(capsys, base + [f"run.dir={tmp_path / 'afile'}"]), "run.dir",
                     "not a directory")
    assert_one_error(*run_main(capsys, base + [f"run.dir={tmp_path / 'fresh'}",
                                               "run.resume=true"]), "no checkpoint")
    # an existing run: refuse to overwrite; refuse an incompatible model
    assert_one_error(*run_main(capsys, base + [f"run.dir={run_dir}"]), "run.resume=true",
                     str(run_dir))
    assert_one_error(*run_main(capsys, base + [f"run.dir={run_dir}", "run.resume=true",
                                               "model.dim=96"]), "model.dim")
    assert_one_error(*run_main(capsys, base + [f"run.dir={run_dir}", "run.resume=true",
                                               "nsa.window=64"]), "nsa.window")
    assert tree_digest(run_dir / "checkpoints") == before
    assert not (tmp_path / "fresh").exists()


# orbax leaves an asyncio callback behind when a read fails; harmless, not ours
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_unreadable_checkpoint_exit_2(tmp_path, capsys, tiny_run):
    import shutil

    run_dir, _, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    args = ["--config", TINY, *SMALL, "train.steps=30", f"run.dir={copy}", "run.resume=true"]
    # a corrupt newest checkpoint falls back to the previous one (tests/test_faults.py); with
    # every checkpoint unreadable the resume is refused, naming the newest
    step_dir = copy / "checkpoints" / "24"
    for step in ("24", "12"):
        (copy / "checkpoints" / step / "meta" / "metadata").write_text("{not json")
    before = tree_digest(copy)
    assert_one_error(*run_main(capsys, args), "unreadable checkpoint", str(step_dir))
    assert tree_digest(copy) == before

    for step in ("24", "12"):
        shutil.copy(run_dir / "checkpoints" / step / "meta" / "metadata",
                    copy / "checkpoints" / step / "meta")
        for f in (copy / "checkpoints" / step / "params").rglob("*"):
            if f.is_file() and "/d/" in str(f):
                f.write_bytes(b"garbage")
    before = tree_digest(copy)
    assert_one_error(*run_main(capsys, args), str(step_dir))
    assert tree_digest(copy) == before


def test_cli_subprocess_help_and_error(tmp_path, compile_cache):
    r = cli(["--help"], compile_cache)
    assert r.returncode == 0
    for opt in ("--config", "--profile", "--debug", "key=value"):
        assert opt in r.stdout
    r = cli(["--config", TINY, "train.lr=-1"], compile_cache)
    assert r.returncode == 2 and r.stderr.strip() == "error: train.lr: must be > 0, got -1.0"
    r = cli(["--config", TINY, "--debug", "train.lr=-1"], compile_cache)
    assert r.returncode == 2 and "Traceback" in r.stderr
    r = cli(["--config", TINY, "--bogus"], compile_cache)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_profile_window():
    from nsa_jax.train.errors import TrainError
    from nsa_jax.train.start import profile_window

    cfg = small_cfg("train.steps=100")
    assert profile_window(cfg, False, 0) is None
    assert profile_window(cfg, True, 0) == (3, 5)
    assert profile_window(cfg, True, 98) == (100, 100)
    assert profile_window(small_cfg("train.steps=100", "train.profile_steps=[7,9]"), True, 0) == (7, 9)
    assert profile_window(small_cfg("train.steps=100", "train.profile_steps=[7,9]"), False, 9) is None
    with pytest.raises(TrainError, match="train.profile_steps"):
        profile_window(small_cfg("train.steps=100", "train.profile_steps=[90,120]"), False, 0)


def test_non_finite_steps_skip_then_abort(tmp_path, capsys):
    """lr=1e30: from the second step on the gradient is not finite; such steps leave the state
    unchanged and train.max_bad_steps of them in a row stop the run with status 1."""
    args = ["--config", TINY, *SMALL, "model.attention=dense", "train.lr=1e30",
            "train.warmup_steps=0", "train.steps=10", "train.log_every=1", "train.max_bad_steps=2",
            f"run.dir={tmp_path / 'run'}"]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: 2 consecutive steps up to step 3 had a non-finite loss")
    entries = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [e["skipped_steps"] for e in entries] == [0, 1, 2]
    assert math.isfinite(entries[0]["grad_norm"])
    assert entries[1]["grad_norm"] is None and entries[2]["grad_norm"] is None   # NaN -> null


def test_watchdog_ends_a_stalled_process():
    code = ("import time\nfrom nsa_jax.train.watchdog import Watchdog\n"
            "w = Watchdog(0.3)\nw.beat('step 7')\ntime.sleep(30)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3 and time.monotonic() - t0 < 20
    assert r.stderr.startswith("error: run.watchdog_s: no progress for 0s (last: step 7)") or \
        r.stderr.startswith("error: run.watchdog_s: no progress for 1s (last: step 7)"), r.stderr


def test_device_divisibility():
    from nsa_jax.train.errors import TrainError
    from nsa_jax.train.mesh import check_batch, mesh_shape

    cfg = small_cfg("train.batch_size=6", "train.grad_accum=2")
    check_batch(cfg, 3, 1)
    with pytest.raises(TrainError, match="train.batch_size: global batch 6 is not divisible by "
                                         "the device count 4"):
        check_batch(cfg, 4, 1)
    with pytest.raises(TrainError, match="train.grad_accum: micro-batch"):
        check_batch(cfg, 6, 1)
    assert mesh_shape(cfg.mesh, 8) == (8, 1)
    with pytest.raises(TrainError, match="mesh.data"):
        mesh_shape(small_cfg("mesh.data=3").mesh, 8)


# ---- optimizer, schedule, accumulation ---------------------------------------------------------
def test_lr_schedule():
    from nsa_jax.train.optim import lr_at

    t = small_cfg("train.steps=110", "train.warmup_steps=10", "train.lr=1.0",
                  "train.min_lr_ratio=0.1").train
    lrs = np.array([float(lr_at(s, t)) for s in range(110)])
    np.testing.assert_allclose(lrs[:10], np.arange(1, 11) / 10, rtol=1e-6)
    np.testing.assert_allclose(lrs[[10, 109]], [1.0, 0.1], rtol=1e-6)
    np.testing.assert_allclose(lrs[59 + 1], 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)),
                               rtol=1e-6)
    assert np.all(np.diff(lrs[10:]) <= 0)


def test_weight_decay_mask():
    from nsa_jax.train.optim import decay_mask, make_optimizer
    from nsa_jax.train.state import ModelSpec

    cfg = small_cfg("train.weight_decay=0.5", "train.grad_clip=0")
    spec = ModelSpec(cfg.model, cfg.nsa)
    mask = decay_mask(spec.abstract_params)
    b0 = mask["blocks"][0]
    assert mask["embed"]["embedding"] is False and mask["norm"]["scale"] is False
    assert b0["norm1"]["scale"] is False and b0["attn"]["wg"]["bias"] is False
    assert b0["attn"]["phi_k"]["pos_emb"] is False and b0["attn"]["phi_k"]["b1"] is False
    for leaf in (b0["attn"]["wq"]["kernel"], b0["attn"]["wkv"]["kernel"],
                 b0["attn"]["phi_k"]["w1"], b0["mlp"]["w_in"]["kernel"]):
        assert leaf is True
    assert all(jax.tree.leaves(decay_mask(spec.abstract_params, include_all=True)))

    # with zero gradients only decayed parameters move
    params = {"embed": {"embedding": jnp.ones((4, 3))}, "norm": {"scale": jnp.ones(3)},
              "w": {"kernel": jnp.ones((3, 3)), "bias": jnp.ones(3)}}
    tx = make_optimizer(cfg.train)
    upd, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    assert float(jnp.abs(upd["embed"]["embedding"]).max()) == 0.0
    assert float(jnp.abs(upd["norm"]["scale"]).max()) == 0.0
    assert float(jnp.abs(upd["w"]["bias"]).max()) == 0.0
    np.testing.assert_allclose(upd["w"]["kernel"], -0.5 * np.ones((3, 3)), rtol=1e-6)
    tx_all = make_optimizer(small_cfg("train.weight_decay=0.5",
                                      "train.decay_norms_biases_embeddings=true").train)
    upd, _ = tx_all.update(jax.tree.map(jnp.zeros_like, params), tx_all.init(params), params)
    np.testing.assert_allclose(upd["embed"]["embedding"], -0.5 * np.ones((4, 3)), rtol=1e-6)


def test_grad_accum_matches_full_batch():
    """Two accumulated micro-batches give the full batch's (clipped) gradient and loss.

    The optimizer is a probe that stores the gradient it receives in its state, so the
    comparison sees the gradients exactly (no parameter subtraction, no Adam normalisation)."""
    from nsa_jax.train.state import ModelSpec, init_state
    from nsa_jax.train.step import make_train_step

    def capture():
        return optax.GradientTransformation(
            lambda p: jax.tree.map(jnp.zeros_like, p),
            lambda g, state, params=None: (jax.tree.map(jnp.zeros_like, g), g))

    cfgs = [small_cfg("model.attention=dense", "train.batch_size=8", f"train.grad_accum={a}")
            for a in (1, 2)]
    spec = ModelSpec(cfgs[0].model, cfgs[0].nsa)
    tx = optax.chain(optax.clip_by_global_norm(0.05), capture())
    rng = np.random.default_rng(0)
    batch = jnp.asarray(rng.integers(0, 256, (8, 65)), jnp.int32)
    s0 = jax.jit(lambda: init_state(spec, tx, 0))()
    steps = [jax.jit(make_train_step(spec, c.train, tx)) for c in cfgs]

    def grads(state):
        return np.concatenate([np.ravel(g) for g in jax.tree.leaves(state.opt_state[1])])

    (s1, st1), (s2, st2) = steps[0](s0, batch), steps[1](s0, batch)
    np.testing.assert_allclose(st1["loss"], st2["loss"], rtol=1e-6)
    np.testing.assert_allclose(st1["grad_norm"], st2["grad_norm"], rtol=1e-5)
    assert float(st1["grad_norm"]) > 0.05          # clipping was active
    g1, g2 = grads(s1), grads(s2)
    np.testing.assert_allclose(np.linalg.norm(g1), 0.05, rtol=1e-5)
    np.testing.assert_allclose(g2, g1, rtol=1e-5, atol=1e-6 * np.abs(g1).max())
    # micro-batch 0 twice (= micro-batch 0 alone) is measurably different
    dup = batch.at[1::2].set(batch[::2])
    g_half = grads(steps[1](s0, dup)[0])
    assert np.abs(g_half - g1).max() > 1e-2 * np.abs(g1).max()


def test_metrics_truncate_after(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    for s in (5, 10, 15, 20):
        log.write({"step": s, "loss": 1.0 / s})
    log.write({"step": 20, "eval_loss": 0.5})
    log.close()
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"step": 25, "lo')            # cut short by a kill
    assert MetricsLog(tmp_path / "m.jsonl").truncate_after(15) == 3
    assert [e["step"] for e in read_metrics(tmp_path / "m.jsonl")] == [5, 10, 15]


# ---- kill -9 and resume: the loss sequence is bit-identical ------------------------------------
def test_kill9_resume_bit_identical(tmp_path, compile_cache):
    """20 steps, a checkpoint every 5: killed right after checkpoint 10 is written, resumed from
    its newest checkpoint to the end. The killed run's 13th train batch never comes
    (``test_faults.DRIVER``), so the kill always lands before the run could finish (a run left
    free reached step 20 ~0.2 s after checkpoint 10, inside a slow poll)."""
    common = ["--config", TINY, *SMALL, "train.steps=20", "train.log_every=1",
              "train.ckpt_every=5", "train.eval_every=10", "train.eval_batches=1"]
    full = cli(common + [f"run.dir={tmp_path / 'full'}"], compile_cache)
    assert full.returncode == 0, full.stderr

    run = tmp_path / "killed"
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps({"stall_train_batch": 13}),
                             *common, f"run.dir={run}"],
                            cwd=ROOT, env=cli_env(compile_cache), stdout=log, stderr=log)
    deadline = time.monotonic() + 240
    try:
        while not (run / "checkpoints" / "10").is_dir():
            assert proc.poll() is None, "run ended before step 10: " + (
                tmp_path / "killed.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint for step 10 in time"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
    assert proc.returncode == -signal.SIGKILL
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert 10 in steps and steps[-1] < 20, steps

    resumed = cli(common + [f"run.dir={run}", "run.resume=true"], compile_cache)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at step {steps[-1]}" in resumed.stdout

    def seq(path):
        e = read_metrics(path / "metrics.jsonl")
        return ([(x["step"], x["loss"], x["grad_norm"]) for x in e if "loss" in x],
                [(x["step"], x["eval_loss"]) for x in e if "eval_loss" in x],
                [(x["step"], x["tokens_seen"]) for x in e if "loss" in x])

    a, b = seq(tmp_path / "full"), seq(run)
    assert [s for s, _, _ in a[0]] == list(range(1, 21))
    assert a == b          # exact float equality, no duplicated or missing steps

    # TensorBoard drops the killed run's orphaned events: the same curve as the full run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def tb(path):
        acc = EventAccumulator(str(path / "tensorboard"))
        acc.Reload()
        return [(e.step, e.value) for e in acc.Scalars("train/loss")]

    assert len(list((run / "tensorboard").iterdir())) == 2
    assert tb(run) == tb(tmp_path / "full") and len(tb(run)) == 20


# ---- two devices (data parallel) and the bundled text sample --------------------------------
def test_two_devices_data_parallel_matches_one(tmp_path, compile_cache, tiny_run):
    """The tiny run again on 2 host devices with grad_accum=2: same losses up to rounding."""
    run_dir, _, _ = tiny_run
    env = cli_env(compile_cache)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
    args = ["--config", TINY, *SMALL, *TINY_RUN, "train.profile_steps=null", "train.grad_accum=2",
            f"run.dir={tmp_path / 'dp'}"]
    r = subprocess.run([sys.executable, "-m", "nsa_jax.train", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2 x cpu | mesh data=2 fsdp=1" in r.stdout
    env_json = json.loads((tmp_path / "dp" / "env.json").read_text())
    assert env_json["device_count"] == 2
    one = read_metrics(run_dir / "metrics.jsonl")
    two = read_metrics(tmp_path / "dp" / "metrics.jsonl")
    assert [e["step"] for e in one] == [e["step"] for e in two]
    for key in ("loss", "eval_loss"):
        a = [e[key] for e in one if key in e]
        b = [e[key] for e in two if key in e]
        np.testing.assert_allclose(b, a, rtol=1e-5)

    r = subprocess.run([sys.executable, "-m", "nsa_jax.train", *args[:-1], "train.batch_size=5", "train.grad_accum=1",
                        f"run.dir={tmp_path / 'odd'}"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: train.batch_size: global "
                                                             "batch 5 is not divisible by the "
                                                             "device count 2"), r.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_two_processes_checkpoint_and_resume(tmp_path, compile_cache):
    """jax.distributed with 2 CPU processes: each loads its share of the batch; the checkpoint
    records both loader positions and a 2-process resume continues from them."""
    run = tmp_path / "mp"
    args = ["--config", TINY, *SMALL, "model.attention=dense", "train.log_every=2",
            "train.ckpt_every=3", f"run.dir={run}"]

    def launch(extra):
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "nsa_jax.train", *args, *extra,
                                   "--coordinator", f"localhost:{port}", "--num-processes", "2",
                                   "--process-id", str(i)], cwd=ROOT, env=cli_env(compile_cache),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        return outs

    outs = launch(["train.steps=6"])
    assert "2 x cpu | mesh data=2" in outs[0] and "step 6/6" not in outs[1]   # process 0 logs
    meta = json.loads((run / "checkpoints" / "6" / "meta" / "metadata").read_text())
    assert [(d["process_index"], d["process_count"], d["seq"]) for d in meta["data"]] == [
        (0, 2, 12), (1, 2, 12)]                 # 6 steps x 2 rows per process
    outs = launch(["train.steps=8", "run.resume=true"])
    assert "resumed at step 6" in outs[0]
    steps = [e["step"] for e in read_metrics(run / "metrics.jsonl") if "loss" in e]
    assert steps == [2, 4, 6, 8]
    meta = json.loads((run / "checkpoints" / "8" / "meta" / "metadata").read_text())
    assert [d["seq"] for d in meta["data"]] == [16, 16]


def test_text_source_gpt2(tmp_path):
    """A few steps of configs/tiny.yaml on the bundled FineWeb-Edu sample (GPT-2 tokenizer)."""
    from nsa_jax.train.loop import train

    cfg = load_config(TINY, ["model.n_layers=1", "data.seq_len=64", "train.batch_size=2",
                             "train.steps=4", "train.log_every=1", "train.eval_every=4",
                             "train.eval_batches=1", "train.ckpt_every=0",
                             f"run.dir={tmp_path / 'run'}"])
    assert cfg.data.source == "text" and cfg.data.tokenizer == "gpt2"
    summary = train(cfg)
    entries = read_metrics(tmp_path / "run" / "metrics.jsonl")
    losses = [e["loss"] for e in entries if "loss" in e]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(cfg.model.vocab_size)) < 1.0      # starts near uniform
    assert losses[-1] < losses[0]
    assert math.isfinite(summary["eval_loss"])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["4"]


def test_init_from_starts_a_fresh_run_from_another_runs_weights(tmp_path, capsys, tiny_run):
    """train.init_from: step 0 of the new run holds the source run's final weights (a
    negligible lr keeps them), with its own data config (here a longer seq_len) and a fresh
    optimizer; a missing run or other parameter shapes is one error naming the key."""
    from nsa_jax.train.checkpoint import load_for_inference
    from nsa_jax.train.loop import train

    src_dir, src_cfg, _ = tiny_run
    _, src_model = load_for_inference(src_dir)
    out = tmp_path / "cont"
    train(small_cfg("train.steps=1", "train.lr=1e-12", "train.warmup_steps=0",
                    "data.seq_len=128", f"train.init_from={src_dir}", f"run.dir={out}"))
    assert f"fresh start from the weights of {src_dir} (step 24)" in capsys.readouterr().out
    cfg, model = load_for_inference(out)
    assert cfg.data.seq_len == 128 and cfg.train.init_from == str(src_dir)
    a = jax.tree.leaves(nnx_params(src_model))
    b = jax.tree.leaves(nnx_params(model))
    assert len(a) == len(b) and all(np.allclose(x, y, atol=1e-6) for x, y in zip(a, b))
    fresh = tmp_path / "fresh"            # without init_from the weights differ
    train(small_cfg("train.steps=1", "train.lr=1e-12", "train.warmup_steps=0",
                    f"run.dir={fresh}"))
    c = jax.tree.leaves(nnx_params(load_for_inference(fresh)[1]))
    assert not all(np.allclose(x, y, atol=1e-3) for x, y in zip(a, c))

    base = ["--config", TINY, *SMALL, "train.steps=1"]
    assert_one_error(*run_main(capsys, base + [f"run.dir={tmp_path / 'x'}",
                                               f"train.init_from={tmp_path / 'nowhere'}"]),
                     "train.init_from: ", "not found")
    assert_one_error(*run_main(capsys, base + [f"run.dir={tmp_path / 'y'}", "model.dim=96",
                                               f"train.init_from={src_dir}"]),
                     "train.init_from: ", "same parameter shapes")


def nnx_params(model):
    from flax import nnx
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))
