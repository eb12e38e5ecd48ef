"""The loop's hooks and the config loader's nested sections, as small units (no training)."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nsa_jax.config import ConfigError, config_warnings, load_config
from nsa_jax.train.errors import TrainingFailed
from nsa_jax.train.hooks import BadStepGuard, CheckpointPolicy

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


class Ready(int):
    def is_ready(self):
        return True


def test_bad_step_guard_checks_in_order_and_names_the_streak():
    guard = BadStepGuard(2, lambda: "no checkpoint was written")
    for step, bad in [(1, 0), (2, 1), (3, 2)]:
        guard.push(step, Ready(bad))
    guard.check(settle=False, before=3)                 # steps 1, 2: fine
    with pytest.raises(TrainingFailed, match="^2 consecutive steps up to step 3"):
        guard.check(settle=True)


def test_checkpoint_policy_defers_inside_a_streak_and_saves_after_it():
    saved, lines = [], []
    start = SimpleNamespace(step=0, resumed=False, ck_dir=Path("ck"),
                            cfg=SimpleNamespace(train=SimpleNamespace(ckpt_every=2, steps=10)))
    reporter = SimpleNamespace(progress=SimpleNamespace(line=lines.append),
                               timed=lambda fn, sync=None: fn())
    policy = CheckpointPolicy(start, None, reporter, SimpleNamespace(beat=lambda *a, **k: None))
    policy.save = lambda step, state: saved.append(step)
    for step, streak in [(2, 0), (4, 1), (5, 2), (6, 0), (8, 0)]:
        policy.maybe(step, None, {"bad_steps": np.int32(streak)})
    assert saved == [2, 6, 8] and len(lines) == 1 and "step 4 deferred" in lines[0]


def test_nested_overrides_yaml_and_moved_keys(tmp_path):
    notes = []
    cfg = load_config(TINY, ["exec.kernel.sel_impl=tiled", "model.remat=block"], notes=notes)
    assert cfg.exec.kernel.sel_impl == "tiled" and cfg.exec.remat == "block"
    assert notes == ["model.remat: moved to exec.remat (how to run, not what the model is); "
                     "read as exec.remat=block"]
    with pytest.raises(ConfigError, match=r"^exec\.kernel\.bogus: unknown key"):
        load_config(TINY, ["exec.kernel.bogus=1"])
    with pytest.raises(ConfigError, match=r"^exec\.kernel\.sel_impl: "):
        load_config(TINY, ["exec.kernel.sel_impl=fast"])
    (tmp_path / "n.yaml").write_text("exec:\n  kernel:\n    cmp_bwd_split: 2\n")
    assert load_config(tmp_path / "n.yaml").exec.kernel.cmp_bwd_split == 2
    (tmp_path / "d.yaml").write_text("model:\n  dim: 64\nmodel:\n  dim: 32\n")
    with pytest.raises(ConfigError, match="key 'model' given twice"):
        load_config(tmp_path / "d.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_config_warnings_name_the_keys():
    w = config_warnings(load_config(TINY, ["data.seq_len=8", "train.steps=5"]))
    assert [x.split("=")[0] for x in w] == ["nsa.n_sel", "data.seq_len", "train.warmup_steps"]
    assert config_warnings(load_config(TINY)) == []


def test_help_spells_defaults_as_yaml():
    from nsa_jax.config import describe_keys

    keys = dict(line.strip().split("=", 1) for line in describe_keys().splitlines())
    assert keys["model.attention"] == "nsa" and keys["model.tie_embeddings"] == "true"
    assert keys["data.path"] == "null" and keys["nsa.branches"] == "[cmp, slc, win]"


def test_tokens_per_s_excludes_the_trace_write_after_a_profiled_step(monkeypatch, tmp_path):
    """The traced step's compute counts as training time, writing the trace does not."""
    import jax

    from nsa_jax.progress import Progress
    from nsa_jax.train import hooks

    clock = [0.0]
    monkeypatch.setattr(hooks, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: None)
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: clock.__setitem__(0, clock[0] + 100))
    start = SimpleNamespace(step=0, tokens_seen=0, elapsed_s=0.0, primary=False, cfg=SimpleNamespace(
        train=SimpleNamespace(batch_size=2, steps=10), data=SimpleNamespace(seq_len=8)))
    reporter = hooks.Reporter(start, None, None, Progress(10, 0, enabled=False))
    profiler = hooks.Profiler((1, 1), tmp_path, lambda line: None)
    stats = {k: np.float32(0) for k in ("loss", "lr", "grad_norm", "skipped", "bad_steps")}
    profiler.before(1)
    clock[0] += 2.0                                    # the traced step computes for 2 s
    reporter.step(stats)
    reporter.pause(profiler.after(1, stats))           # then the trace takes 100 s to write
    reporter.log(1, stats)
    assert reporter.last["tokens_per_s"] == 2 * 8 / 2.0


def test_progress_plain_lines(monkeypatch):
    import io

    from nsa_jax import progress

    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    out = io.StringIO()
    p = progress.Progress(None, unit="doc", stream=out, every_s=10)
    p.start()
    for _ in range(3):
        clock[0] += 6
        p.update(1, lambda: f"at {clock[0]:.0f}s, {p.rate(2):.1f}/s", tokens=5)
    p.line("done")
    assert out.getvalue() == "at 12s, 0.2/s\ndone\n"
    silent = progress.Progress(5, enabled=False, stream=out)
    silent.show("not shown", loss="1")
    assert out.getvalue().endswith("done\n")


MOVED_NOTE = ("warning: model.remat: moved to exec.remat (how to run, not what the model is); "
              "read as exec.remat=block\n")


def test_prepare_and_generate_warn_about_moved_keys(tmp_path, capsys):
    import json

    from nsa_jax.data.prepare import main as prepare_main
    from nsa_jax.train.errors import CheckpointError
    from nsa_jax.train.inference import restore_for_inference

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n"
                                              for i in range(3)))
    conf = tmp_path / "p.yaml"
    conf.write_text(f"data:\n  source: text\n  path: {tmp_path / 'd.jsonl'}\n  tokenizer: byte\n"
                    f"  out_dir: {tmp_path / 'out'}\nmodel:\n  remat: block\n")
    assert prepare_main(["--config", str(conf)]) == 0
    assert capsys.readouterr().err == MOVED_NOTE
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  remat: block\n")
    with pytest.raises(CheckpointError, match="no checkpoints directory"):
        restore_for_inference(run)
    assert capsys.readouterr().err == MOVED_NOTE


def test_data_errors_name_the_keys_on_one_line(tmp_path):
    from nsa_jax.data import DataError, build_loader
    from nsa_jax.train.start import _probe_eval

    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(f"document {i} " * 20)
    base = ["data.source=text", f"data.path={tmp_path}", "data.tokenizer=byte", "train.eval_every=10"]
    with pytest.raises(DataError, match=r"eval split .* the first document it holds out is "
                                        r"document 20\).*train\.eval_every=10 needs an eval split"):
        _probe_eval(load_config(TINY, base), 0, 1)
    with pytest.raises(DataError, match=r"^data\.eval_fraction: is 0.*train\.eval_every=10"):
        _probe_eval(load_config(TINY, [*base, "data.eval_fraction=0"]), 0, 1)
    pytest.importorskip("datasets")
    hf = load_config(TINY, ["data.source=hf", "data.tokenizer=byte", "data.hf_config=null",
                            "data.retries=0", f"data.hf_name={tmp_path}",
                            "data.path=nsa_jax/assets/data/fineweb_edu_sample.jsonl"])
    with pytest.raises(DataError) as e:
        build_loader(hf, "train", 1)
    msg = str(e.value)
    assert msg.startswith("data.path: cannot open") and "data.path=null" in msg
    assert "\n" not in msg and len(msg) < 500
