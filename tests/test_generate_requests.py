"""What the generation API and CLI refuse, and how the CLI reads prompts and ends after a
Ctrl-C (``nsa_jax.request``, ``nsa_jax.generate_cli``; found by the forty-sixth session's
review). The requests of a trained run are in ``tests/test_generate.py``."""
import math
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_jax.config import ModelConfig
from nsa_jax.errors import EXIT_INTERRUPTED
from nsa_jax.generate import RequestError, generate_batch, main, read_prompts
from nsa_jax.model import build_model
from nsa_jax.nsa import NSAConfig
from nsa_jax.request import check_request, free_memory

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64)
    return build_model(mcfg, NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16))


@pytest.mark.parametrize("kw,needle", [
    (dict(temperature=-1.0), "temperature: must be a finite number >= 0"),
    (dict(temperature=math.nan), "temperature: must be a finite number >= 0"),
    (dict(temperature=math.inf), "temperature: must be a finite number >= 0"),
    (dict(top_p=0.0), "top_p: must be in (0, 1]"),
    (dict(top_p=1.5), "top_p: must be in (0, 1]"),
    (dict(top_k=-1), "top_k: must be >= 0"),
    (dict(top_k=2.5), "top_k: must be >= 0"),
    (dict(seed=2 ** 64), "seed: must be an integer in [-2**63, 2**63)"),
    (dict(steps_per_call=0), "steps_per_call: must be >= 1"),
])
def test_the_api_refuses_sampling_it_would_get_wrong(model, kw, needle):
    """Out of range these sampled silently from another distribution (a negative or NaN
    temperature as 1, top_p 0 as token 0, an infinite temperature as a padding id)."""
    with pytest.raises(RequestError) as e:
        generate_batch(model, [[1, 2, 3]], 2, **kw)
    assert str(e.value).startswith(needle), str(e.value)


def test_a_prompt_filling_the_context_names_the_prompt_not_new_tokens():
    with pytest.raises(RequestError) as e:
        check_request([[1] * 8, [1] * 5], 1, 8)
    assert e.value.arg == "prompts" and "prompt 0 has 8 tokens, the whole context" in str(
        e.value)
    assert e.value.message({"max_len": "--max-len", "prompts": "--prompt"}).endswith(
        "a larger --max-len)")


def test_a_memory_limit_below_the_weights_names_the_memory_limit(model):
    with pytest.raises(RequestError) as e:
        free_memory(model, memory_limit=1000)
    assert e.value.arg == "memory_limit" and "does not hold the weights" in str(e.value)
    with pytest.raises(RequestError, match="^memory_limit: "):
        generate_batch(model, [[1, 2, 3]], 2, memory_limit=1000)


def test_prompts_file_lines_end_only_at_newlines(tmp_path):
    """A byte-order mark is not part of the first prompt; CRLF ends are stripped; characters
    ``str.splitlines`` also splits at (U+2028, U+0085, form feed) stay inside their prompt."""
    f = tmp_path / "p.txt"
    f.write_bytes("\ufefffirst\u2028still first\r\n\nsecond\x0cpart\u0085end\r\n  \n".encode())
    assert read_prompts(str(f)) == ["first\u2028still first", "second\x0cpart\u0085end"]


def test_interrupt_before_any_token_writes_nothing_to_stdout(monkeypatch, capsys):
    import nsa_jax.inference as inference

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(inference, "load_run", interrupted)
    assert main(["--checkpoint", "x", "--prompt", "hi"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().out == ""


def test_exit_process_after_an_interrupt_flushes_and_skips_teardown():
    """``python -m nsa_jax.generate`` ends an interrupted run with ``os._exit`` (a Ctrl-C inside
    an XLA compile could crash jaxlib's teardown): the block-buffered stdout still arrives, and
    no atexit hook runs. Any other status is a plain SystemExit."""
    child = ("import atexit, sys\n"
             "from nsa_jax.generate_cli import exit_process\n"
             "atexit.register(lambda: print('teardown', file=sys.stderr))\n"
             "sys.stdout.write('partial')\n"
             "exit_process(int(sys.argv[1]))\n")
    for status, err in ((EXIT_INTERRUPTED, ""), (2, "teardown\n")):
        r = subprocess.run([sys.executable, "-c", child, str(status)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (status, "partial", err), r


def test_one_call_generation_still_reports_a_decode_rate(model):
    """The issue asks for decode tokens/s at the end of every generation: with all tokens in the
    first (compiling) call, its rate without the compilation is reported, marked as such."""
    from nsa_jax.generate import Timing

    t = Timing()
    generate_batch(model, [[1, 2, 3], [4]], 4, steps_per_call=16, timing=t)
    assert t.first_steps == 4 and t.decode_tokens == 0
    assert 0 < t.first_compile_s < t.first_step_s
    line = t.lines()[1]
    assert line.startswith("decode: 8 tokens (2 row(s) x 4 steps, one call) in ") and (
        " tok/s, from the first call alone" in line), line
    t2 = Timing()
    generate_batch(model, [[1, 2, 3], [4]], 4, steps_per_call=2, timing=t2)
    assert t2.decode_tokens == 4 and "from the first call alone" not in t2.lines()[1]


def test_a_run_trained_with_a_relative_tokenizer_path_generates_from_anywhere(tmp_path,
                                                                                monkeypatch):
    """config.yaml keeps data.tokenizer as given (here relative to the directory training
    started in); the run directory holds a copy of the file, which load_run reads, so the run
    generates from another directory too (before: one error naming data.tokenizer)."""
    import shutil

    from nsa_jax.data.tokenizer import GPT2_PATH
    from nsa_jax.inference import load_run
    from nsa_jax.train.cli import main as train_main

    work = tmp_path / "work"
    (work / "tok").mkdir(parents=True)
    shutil.copy(GPT2_PATH, work / "tok" / "tokenizer.json")
    monkeypatch.chdir(work)
    assert train_main(["--config", str(REPO / "configs" / "tiny.yaml"), "data.source=synthetic",
                       "data.path=null", "data.seq_len=32", "data.tokenizer=tok/tokenizer.json",
                       "model.dim=32", "model.n_layers=1", "model.n_heads=2",
                       "model.n_kv_groups=1", "model.head_dim=16", "model.mlp_hidden=64",
                       "model.attention=dense", "train.batch_size=2", "train.steps=1",
                       "train.eval_every=0", f"run.dir={tmp_path / 'run'}"]) == 0
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == GPT2_PATH.read_bytes()
    monkeypatch.chdir(tmp_path)                     # tok/tokenizer.json does not resolve here
    run = load_run(tmp_path / "run")
    assert run.cfg.data.tokenizer == "tok/tokenizer.json"
    assert run.encode("Hello") == [15496] and len(run.generate(["Hello"], 2)) == 1
