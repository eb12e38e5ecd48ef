"""``exec.compile_cache`` / ``--compile-cache`` (:mod:`nsa_jax.compile_cache`): a compiled program
is written to the directory and read back after JAX's in-memory caches are cleared; bad paths
are one error naming the setting, and nothing is created before the first compilation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from nsa_jax import compile_cache
from nsa_jax.config import ConfigError, load_config
from nsa_testutil import shared
from test_generate import _train_tiny
from test_train import TINY, small_cfg


@pytest.fixture(scope="session")
def gen_tiny_run(tmp_path_factory, worker_id):
    """test_generate's tiny trained run (the same one: shared by name through a file lock)."""
    return shared(tmp_path_factory, worker_id, "gen_tiny_run", _train_tiny)


@pytest.fixture
def fresh_cache_state():
    """Leave JAX's process-wide cache settings as the test found them."""
    before_dir = jax.config.jax_compilation_cache_dir
    before_min = jax.config.jax_persistent_cache_min_compile_time_secs
    yield
    if before_dir is None:
        compile_cache.disable()
    else:
        compile_cache.enable(before_dir, min_compile_s=before_min)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before_min)


def _hits():
    """A counter of JAX's persistent-cache hits (its monitoring event), and the unregistering."""
    seen = []

    def listener(event, **kw):
        if event == "/jax/compilation_cache/cache_hits":
            seen.append(event)
    jax.monitoring.register_event_listener(listener)
    return seen, lambda: jax.monitoring.unregister_event_listener(listener)


def test_compiled_program_is_written_then_read_back(tmp_path, fresh_cache_state):
    first = tmp_path / "first"              # a cache already in use: enable moves to the new one
    compile_cache.enable(first, min_compile_s=0)
    jax.jit(lambda x: x * 2.0 + 1.0)(jnp.ones(3))
    assert first.is_dir()
    d = tmp_path / "new" / "cache"
    assert compile_cache.enable(d, min_compile_s=0) == d.resolve()
    assert not d.exists()                       # JAX creates it at its first entry
    assert compile_cache.current() == d.resolve()

    def f(x):
        return jnp.tanh(x @ x.T).sum(axis=0) * 3.0

    x = jnp.arange(48.0).reshape(6, 8)
    want = jax.jit(f)(x)
    entries = [p.name for p in d.iterdir()]
    assert any(n.startswith("jit_f-") and n.endswith("-cache") for n in entries), entries
    jax.clear_caches()                          # the process forgets its compiled f
    seen, stop = _hits()
    try:
        got = jax.jit(f)(x)
    finally:
        stop()
    assert seen, "the second compile of f was not read from the cache"
    assert jnp.array_equal(got, want)
    assert compile_cache.enable(d, min_compile_s=0) == d.resolve()   # again: a no-op


@pytest.mark.parametrize("case", ["file", "under a file", "empty"])
def test_bad_paths_name_the_setting(case, tmp_path, fresh_cache_state):
    f = tmp_path / "f.txt"
    f.write_text("x")
    path, needle = {"file": (f, "exists and is not a directory"),
                    "under a file": (f / "sub", "is not a directory"),
                    "empty": ("  ", "empty")}[case]
    with pytest.raises(compile_cache.CompileCacheError) as e:
        compile_cache.enable(path, key="--compile-cache")
    msg = str(e.value)
    assert msg.startswith("--compile-cache: ") and needle in msg and "\n" not in msg
    assert compile_cache.current() is None or compile_cache.current() != f


def test_config_key_validated_and_enabled_by_preflight(tmp_path, fresh_cache_state):
    with pytest.raises(ConfigError, match=r"^exec\.compile_cache: empty"):
        load_config(TINY, ["exec.compile_cache=''"])
    from nsa_jax.train.errors import TrainError
    from nsa_jax.train.start import preflight

    bad = tmp_path / "file"
    bad.write_text("x")
    with pytest.raises(TrainError, match=r"^exec\.compile_cache: .* is not a directory"):
        preflight(small_cfg(f"run.dir={tmp_path / 'run_bad'}", f"exec.compile_cache={bad}"))
    assert not (tmp_path / "run_bad").exists()
    d = tmp_path / "cc"
    start = preflight(small_cfg(f"run.dir={tmp_path / 'run'}", f"exec.compile_cache={d}"))
    try:
        assert compile_cache.current() == d.resolve()
    finally:
        if start.loader is not None:
            start.loader.close()


def test_generate_cli_bad_compile_cache_exits_2_without_output(tmp_path, capsys,
                                                               fresh_cache_state):
    from nsa_jax.generate_cli import main

    f = tmp_path / "f.txt"
    f.write_text("x")
    assert main(["--checkpoint", str(tmp_path / "no_run"), "--prompt", "hi",
                 "--compile-cache", str(f)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1, cap
    assert err[0].startswith("error: --compile-cache: ") and "not a directory" in err[0]


def test_generate_cli_with_compile_cache_writes_then_reads(gen_tiny_run, tmp_path, capsys,
                                                           monkeypatch, fresh_cache_state):
    """The flag's good path: the same greedy text with and without the cache, entries written
    by the first run; the second run's compiles are read back (JAX's cache-hit event). The
    tiny model compiles in under JAX's 1 s threshold, so the CLI's ``enable`` gets 0 here."""
    from nsa_jax.generate_cli import main

    enable = compile_cache.enable
    monkeypatch.setattr(compile_cache, "enable",
                        lambda path, **kw: enable(path, **{**kw, "min_compile_s": 0}))
    d = tmp_path / "cc"
    argv = ["--checkpoint", str(gen_tiny_run), "--prompt", "The history of", "--max-new-tokens",
            "6", "--temperature", "0"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    jax.clear_caches()
    assert main(argv + ["--compile-cache", str(d)]) == 0
    assert capsys.readouterr().out == plain
    assert any(p.name.endswith("-cache") for p in d.iterdir())
    jax.clear_caches()
    seen, stop = _hits()
    try:
        assert main(argv + ["--compile-cache", str(d)]) == 0
    finally:
        stop()
    assert capsys.readouterr().out == plain and seen
