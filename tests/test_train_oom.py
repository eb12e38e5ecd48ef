"""Training out of memory: one line naming the device and the keys that drive memory, exit
status 4, and nothing half-written -- a fresh run's start-up files (and the run directory it
created) are removed; a resumed run, a run with a checkpoint, or a directory that existed before
keep every file.

The failure is XLA's own exception type with its message (what ``data.seq_len=100000`` on the
CPU reference path raises: ``RESOURCE_EXHAUSTED: Out of memory allocating 7052732239744
bytes.``), raised by a stand-in for the compiled train step: deterministic, no memory used.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import jax

from nsa_jax.data.tokenizer import GPT2_PATH
from nsa_jax.train.cli import main
from nsa_jax.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
SMALL = ["data.source=synthetic", "data.path=null", "data.seq_len=32", "data.prefetch=1",
         "model.vocab_size=256", "model.dim=32", "model.n_layers=1", "model.n_heads=2",
         "model.n_kv_groups=1", "model.head_dim=16", "model.mlp_hidden=64",
         "model.attention=dense", "train.batch_size=2", "train.warmup_steps=1",
         "train.eval_every=0"]
OOM = "RESOURCE_EXHAUSTED: Out of memory allocating 7052732239744 bytes."


def oom_after(monkeypatch, good_steps: int) -> None:
    """The train step runs ``good_steps`` times, then raises XLA's out-of-memory error (with
    ``good_steps=0`` nothing is compiled)."""
    real = Trainer._compile

    def _compile(self):
        step_fn, eval_fn = real(self) if good_steps else (None, None)
        calls = []

        def step(state, batch):
            calls.append(1)
            if len(calls) > good_steps:
                raise jax.errors.JaxRuntimeError(OOM)
            return step_fn(state, batch)

        return step, eval_fn

    monkeypatch.setattr(Trainer, "_compile", _compile)


def run(capsys, *args):
    code = main(["--config", TINY, *SMALL, *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err.strip().splitlines()


def files(path: Path) -> dict:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def assert_oom_line(code, err):
    assert code == 4, err
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("error: out of memory on the cpu (host RAM) in the train step"), line
    assert "RESOURCE_EXHAUSTED: Out of memory allocating 7052732239744 bytes (6.4 TiB)" in line
    for key in ("data.seq_len (now 32)", "train.batch_size (now 2)", "train.grad_accum",
                "exec.remat=block"):
        assert key in line, line
    assert "internal error" not in line and "Traceback" not in line
    return line


def test_fresh_run_out_of_memory_is_one_line_exit_4_and_leaves_nothing(tmp_path, capsys,
                                                                         monkeypatch):
    """Before: ``error: internal error: JaxRuntimeError: ...``, status 1, and config.yaml,
    env.json, heartbeat.json, tokenizer.json, tensorboard/ and an empty checkpoints/ left in
    the new run directory."""
    oom_after(monkeypatch, 0)
    out = tmp_path / "runs" / "a"
    code, _, err = run(capsys, f"data.tokenizer={GPT2_PATH}", "model.vocab_size=50304",
                       f"run.dir={out}")
    line = assert_oom_line(code, err)
    assert "(step 1)" in line
    assert line.endswith(f"; no checkpoint was written; removed the new run directory {out}")
    assert not out.exists()
    assert (tmp_path / "runs").is_dir()            # only the run directory itself goes

    # the same run again: nothing was in its way
    monkeypatch.undo()
    code, _, err = run(capsys, "train.steps=1", f"run.dir={out}")
    assert code == 0, err
    assert {"config.yaml", "env.json", "metrics.jsonl"} <= set(files(out))


def test_out_of_memory_in_a_directory_that_existed_removes_nothing(tmp_path, capsys,
                                                                    monkeypatch):
    """``run.dir`` made beforehand (by hand, a job script): this run did not create it, so it
    keeps everything, also what this run wrote."""
    oom_after(monkeypatch, 0)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    code, _, err = run(capsys, f"run.dir={out}")
    line = assert_oom_line(code, err)
    assert "removed" not in line
    assert {"notes.txt", "config.yaml", "env.json"} <= set(files(out))
    assert (out / "checkpoints").is_dir()


def test_out_of_memory_after_a_checkpoint_and_on_resume_deletes_nothing(tmp_path, capsys,
                                                                        monkeypatch):
    """A fresh run that saved a checkpoint (step 1; no metrics line yet) and then runs out of
    memory keeps every file; so does a resumed run that runs out of memory at once."""
    out = tmp_path / "run"
    oom_after(monkeypatch, 1)
    code, _, err = run(capsys, "train.steps=3", "train.ckpt_every=1", "train.log_every=100",
                       f"run.dir={out}")
    line = assert_oom_line(code, err)
    assert f"the newest complete checkpoint is step 1 ({out / 'checkpoints' / '1'})" in line
    assert "removed" not in line
    before = files(out)
    assert "config.yaml" in before and any(k.startswith("checkpoints/1/") for k in before)

    oom_after(monkeypatch, 0)
    code, out_text, err = run(capsys, "train.steps=3", "train.ckpt_every=1",
                              "train.log_every=100", f"run.dir={out}", "run.resume=true")
    assert "resumed at step 1" in out_text
    line = assert_oom_line(code, err)
    assert "(step 2)" in line and "removed" not in line
    after = files(out)
    assert set(before) <= set(after)               # nothing deleted
    assert {k: v for k, v in after.items() if k.startswith("checkpoints/")} == \
        {k: v for k, v in before.items() if k.startswith("checkpoints/")}


def test_is_out_of_memory():
    from nsa_jax.config import load_config
    from nsa_jax.train.errors import OutOfMemory, TrainingFailed
    from nsa_jax.train.memory import is_out_of_memory, out_of_memory

    xla = jax.errors.JaxRuntimeError
    assert is_out_of_memory(xla(OOM))
    assert is_out_of_memory(xla("RESOURCE_EXHAUSTED: Failed to allocate request for 12.00GiB"))
    assert is_out_of_memory(MemoryError("Unable to allocate 7.45 GiB for an array"))
    assert not is_out_of_memory(xla("INTERNAL: Failed to launch kernel"))
    assert not is_out_of_memory(ValueError("Out of memory"))     # not an allocation
    try:                                                         # found through the cause
        try:
            raise xla(OOM)
        except RuntimeError as inner:
            raise RuntimeError("while saving") from inner
    except RuntimeError as e:
        assert is_out_of_memory(e)

    cfg = load_config(TINY, SMALL + ["train.grad_accum=2", "exec.remat=block"])
    e = out_of_memory(MemoryError(), cfg, "while loading the run's starting point")
    assert isinstance(e, OutOfMemory) and isinstance(e, TrainingFailed)
    msg = str(e)
    assert msg.startswith("out of memory on the cpu (host RAM) while loading the run's "
                          "starting point: MemoryError; ")
    assert "data.seq_len (now 32)" in msg and "train.batch_size (now 2)" in msg
    # micro-batches of one sequence and remat on: those hints would not help
    assert "train.grad_accum" not in msg and "exec.remat" not in msg
