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
