"""Typed YAML config: shipped configs load; unknown keys and bad values fail with one clear line."""
from pathlib import Path

import pytest

from nsa_jax.config import ConfigError, load_config, save_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["tiny", "showcase", "nsa_125m", "dense_125m"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.name == name


def test_showcase_and_125m_shapes():
    s = load_config(ROOT / "configs/showcase.yaml")
    assert (s.model.dim, s.model.n_heads, s.model.n_kv_groups, s.model.head_dim) == (128, 8, 2, 16)
    assert (s.nsa.block_l, s.nsa.stride_d, s.nsa.sel_block, s.nsa.n_sel, s.nsa.window) == (16, 8, 32, 8, 64)
    assert (s.data.seq_len, s.train.batch_size) == (128, 8)
    m = load_config(ROOT / "configs/nsa_125m.yaml")
    assert (m.model.dim, m.model.n_layers, m.model.n_heads, m.model.n_kv_groups,
            m.model.head_dim, m.model.vocab_size) == (768, 12, 12, 2, 64, 50304)
    assert (m.nsa.block_l, m.nsa.stride_d, m.nsa.sel_block, m.nsa.n_sel, m.nsa.window) == (32, 16, 64, 16, 512)
    assert m.data.seq_len == 2048 and m.model.attention == "nsa"
    d = load_config(ROOT / "configs/dense_125m.yaml")
    assert d.model.attention == "dense" and d.model.dim == 768


def test_overrides_apply_with_types():
    cfg = load_config(ROOT / "configs/tiny.yaml",
                      ["train.steps=7", "train.lr=1e-3", "nsa.branches=[cmp,win]", "run.resume=true",
                       "train.profile_steps=[2,3]"])
    assert cfg.train.steps == 7 and cfg.train.lr == 1e-3 and cfg.run.resume is True
    assert cfg.nsa.branches == ("cmp", "win") and cfg.train.profile_steps == [2, 3]


def test_roundtrip(tmp_path):
    cfg = load_config(ROOT / "configs/tiny.yaml", ["train.steps=3"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("override,message", [
    (["train.stepz=3"], r"^train\.stepz: unknown key"),
    (["trian.steps=3"], r"^trian: unknown section"),
    (["train.steps=abc"], r"^train\.steps: must be an integer"),
    (["train.steps=0"], r"^train\.steps: must be >= 1"),
    (["train.lr=-1"], r"^train\.lr: must be > 0"),
    (["model.attention=sparse"], r"^model\.attention: must be one of"),
    (["model.n_kv_groups=3"], r"^model\.n_kv_groups: "),
    (["nsa.stride_d=5"], r"^nsa\.block_l: "),
    (["nsa.n_sel=1"], r"^nsa\.n_sel: "),
    (["run.resume=maybe"], r"^run\.resume: must be true or false"),
    (["train.steps"], r"expected key=value"),
    (["train.batch_size=9", "train.grad_accum=2"], r"^train\.grad_accum: "),
    (["data.source=text", "data.path=null"], r"^data\.path: required"),
    (["data.max_docs=-1"], r"^data\.max_docs: must be >= 0 \(0 = all documents\)"),
    (["steps=3"], r"^steps: overrides need section\.key"),
])
def test_bad_values_rejected(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "configs/tiny.yaml", override)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "sec.yaml").write_text("model: 3\n")
    with pytest.raises(ConfigError, match="^model: must be a mapping"):
        load_config(tmp_path / "sec.yaml")


def test_retrieval_section_nested_and_flat_keys_migrate(tmp_path):
    """``data.retrieval`` is a section (overrides reach three levels); the flat
    ``data.retrieval_*`` keys of older configs and run dirs load, one note each naming the new
    key; both spellings at once is an error naming both."""
    from nsa_jax.config import RetrievalConfig

    cfg = load_config(ROOT / "configs" / "quality_retrieval.yaml", ["data.retrieval.pairs=40"])
    assert cfg.data.retrieval.pairs == 40 and cfg.data.retrieval.loss == "answers"
    (tmp_path / "old.yaml").write_text("data:\n  source: retrieval\n  retrieval_pairs: 48\n"
                                       "  retrieval_loss: answers\n")
    notes = []
    old = load_config(tmp_path / "old.yaml", ["data.retrieval_queries=8"], notes=notes)
    assert (old.data.retrieval.pairs, old.data.retrieval.queries) == (48, 8)
    assert old.data.retrieval == RetrievalConfig(pairs=48, queries=8, loss="answers")
    assert sorted(notes) == sorted(
        f"data.retrieval_{k}: moved to data.retrieval.{k} (one section for the retrieval "
        f"source); read as data.retrieval.{k}={v}"
        for k, v in (("pairs", 48), ("loss", "answers"), ("queries", 8)))
    with pytest.raises(ConfigError, match=r"^data\.retrieval_pairs: moved to "
                                          r"data\.retrieval\.pairs, and both are given"):
        load_config(tmp_path / "old.yaml", ["data.retrieval.pairs=40"])
    with pytest.raises(ConfigError, match=r"^data\.retrieval\.bogus: unknown key"):
        load_config(tmp_path / "old.yaml", ["data.retrieval.bogus=1"])
    assert old.to_dict()["data"]["retrieval"]["pairs"] == 48      # saved nested


def test_resume_check_covers_the_data_stream_but_not_how_it_is_read():
    """A resume refuses another token stream (its saved data position would point into the
    wrong one: another packing, path, eval split or seed); a key added since the saved run
    counts as its default; how the stream is read (prefetch, retries) may change."""
    from nsa_jax.config import DATA_STREAM_KEYS, Config, apply_overrides, config_from_dict
    from nsa_jax.train.recovery import config_mismatch

    saved = apply_overrides(Config().to_dict(), ["data.source=text", "data.path=x.jsonl"])

    def cfg(*over):
        return config_from_dict(apply_overrides(saved, list(over)))

    assert config_mismatch(saved, cfg()) is None
    for over in ("data.prefetch=7", "data.retries=1", "train.steps=99", "train.lr=1e-3"):
        assert config_mismatch(saved, cfg(over)) is None, over
    for over, key in (("data.packing=documents", "data.packing"),
                      ("data.path=y.jsonl", "data.path"),
                      ("data.eval_fraction=0", "data.eval_fraction"),
                      ("train.seed=3", "train.seed"),
                      ("data.retrieval.max_distance=5", "data.retrieval")):
        diff = config_mismatch(saved, cfg(over))
        assert diff is not None and diff.startswith(f"{key}: the run was trained with"), over
    old = {**saved, "data": {k: v for k, v in saved["data"].items() if k != "packing"}}
    assert config_mismatch(old, cfg()) is None                    # missing: the default
    assert config_mismatch(old, cfg("data.packing=documents")) is not None
    assert {k.split(".")[0] for k in DATA_STREAM_KEYS} == {"data", "train"}
