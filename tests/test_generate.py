"""Sampling, text streaming and the ``python -m nsa_jax.generate`` CLI on a freshly trained run."""
import io
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.data import get_tokenizer
from nsa_jax.generate import RequestError, TextStream, generate_batch, generate_ids, main, sample
from nsa_testutil import shared, small_lm

REPO = Path(__file__).resolve().parent.parent


def test_greedy_and_top1_are_argmax():
    logits = jax.random.normal(jax.random.PRNGKey(0), (6, 40))
    want = np.argmax(np.asarray(logits), axis=-1)
    key = jax.random.PRNGKey(1)
    np.testing.assert_array_equal(sample(logits, key, temperature=0.0), want)
    np.testing.assert_array_equal(sample(logits, key, temperature=1.7, top_k=1), want)
    np.testing.assert_array_equal(sample(logits, key, temperature=1.0, top_p=1e-6), want)
    # greedy never picks vocabulary padding, however large its logit
    padded = logits.at[:, 35:].set(100.0)
    np.testing.assert_array_equal(sample(padded, key, temperature=0.0, vocab_limit=35),
                                  np.argmax(np.asarray(logits)[:, :35], axis=-1))


def _freqs(probs, n=20000, **kw):
    logits = jnp.log(jnp.asarray(probs, jnp.float32))
    ids = sample(jnp.broadcast_to(logits, (n, len(probs))), jax.random.PRNGKey(7), **kw)
    return np.bincount(np.asarray(ids), minlength=len(probs)) / n


def test_sampling_distribution_with_filters():
    probs = [0.5, 0.3, 0.15, 0.05, 1e-3, 1e-3]   # last two: "padding" with vocab_limit=4
    # plain sampling follows the softmax (excluding padding ids)
    f = _freqs(probs, vocab_limit=4)
    np.testing.assert_allclose(f[:4], np.array(probs[:4]) / sum(probs[:4]), atol=0.015)
    assert f[4:].sum() == 0
    # top-k = 2: renormalised over {0, 1}
    np.testing.assert_allclose(_freqs(probs, top_k=2), [0.625, 0.375, 0, 0, 0, 0], atol=0.015)
    # nucleus p = 0.7: {0, 1} (0.5 < 0.7 <= 0.8); p = 0.85: {0, 1, 2}
    np.testing.assert_allclose(_freqs(probs, top_p=0.7)[:3], [0.625, 0.375, 0], atol=0.015)
    f = _freqs(probs, top_p=0.85)
    np.testing.assert_allclose(f[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.015)
    assert f[3:].sum() == 0
    # temperature 2 flattens: p_i^(1/2), renormalised
    want = np.sqrt(probs[:4]) / np.sqrt(probs[:4]).sum()
    np.testing.assert_allclose(_freqs(probs, temperature=2.0, vocab_limit=4)[:4], want,
                               atol=0.015)


def test_text_stream_never_splits_utf8():
    tok = get_tokenizer("gpt2")
    text = "naïve café 😀 ok — 漢字"
    ids = tok.encode(text)
    out = io.StringIO()
    stream = TextStream(tok, out)
    pieces = []
    for i in ids:
        before = out.getvalue()
        stream.push(i)
        pieces.append(out.getvalue()[len(before):])
    assert stream.close() == text and out.getvalue() == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > text.count(" ") + 1   # the emoji / CJK really span several tokens


@pytest.mark.parametrize("argv,needle", [
    (["--checkpoint", "/nonexistent/run"], "/nonexistent/run: run directory not found"),
    (["--checkpoint", "x", "--top-p", "0"], "--top-p"),
    (["--checkpoint", "x", "--temperature", "-1"], "--temperature"),
    (["--checkpoint", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["--checkpoint", "x", "--steps-per-call", "0"],
     "--steps-per-call: must be >= 1 (an integer), got 0"),
    (["--checkpoint", "x", "--temperature", "inf"], "--temperature: must be a finite number"),
    (["--checkpoint", "x", "--temperature", "nan"], "--temperature"),
    (["--checkpoint", "x", "--memory-limit", "inf"], "--memory-limit: must be a finite number"),
    (["--checkpoint", "x", "--seed", str(2 ** 64)], "--seed: must be an integer in"),
    (["--checkpoint", "x", "--top-k", "-1"], "--top-k"),
    (["--checkpoint", "x", "--prefill-chunk", "0"], "--prefill-chunk: must be a positive"),
    (["--prompt", "hi"], "--checkpoint"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err


def _train_tiny(run_dir: Path) -> None:
    cmd = [sys.executable, "-m", "nsa_jax.train", "--config", "configs/tiny.yaml",
           "train.steps=2", "train.batch_size=2", "data.seq_len=64", "train.eval_every=0",
           "train.log_every=1", "train.warmup_steps=1", f"run.dir={run_dir}"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, worker_id):
    """The tiny training run (2 steps, checkpoint at step 2), trained once per test session
    (pytest-xdist workers share it through a file lock; the tests only read it)."""
    return shared(tmp_path_factory, worker_id, "gen_tiny_run", _train_tiny)


def test_cli_generates_from_trained_run(tiny_run, tmp_path, capsys):
    """Greedy CLI output equals argmax of the full forward, seeded sampling is reproducible,
    an incompatible checkpoint is a one-line exit 2."""
    run = tiny_run
    prompt = "The history of science"

    # greedy through the CLI
    assert main(["--checkpoint", str(run), "--prompt", prompt, "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith(prompt) and len(cap.out) > len(prompt)
    assert "error" not in cap.err

    # the same ids through the API agree with the parallel forward's argmax, token by token
    from nsa_jax.train.checkpoint import load_for_inference
    cfg, model = load_for_inference(run)
    tok = get_tokenizer(cfg.data.tokenizer)
    p_ids = tok.encode(prompt)
    ids = generate_ids(model, p_ids, 12, temperature=0.0, vocab_limit=tok.vocab_size,
                       eos_id=tok.eos_id)
    assert cap.out == prompt + tok.decode([i for i in ids if i != tok.eos_id]) + "\n"
    seq = jnp.asarray([p_ids + ids], jnp.int32)
    graphdef, state = nnx.split(model)
    logits = jax.jit(lambda s, x: nnx.merge(graphdef, s).logits(x))(state, seq)
    want = np.argmax(np.asarray(logits)[0, len(p_ids) - 1:-1, :tok.vocab_size], axis=-1)
    np.testing.assert_array_equal(ids, want[:len(ids)])

    # seeded sampling is reproducible; another seed is a different stream
    outs = []
    for seed in (5, 5, 6):
        assert main(["--checkpoint", str(run), "--prompt", prompt, "--max-new-tokens", "8",
                     "--temperature", "1.0", "--top-k", "50", "--top-p", "0.95",
                     "--seed", str(seed)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0] != outs[2]

    # a checkpoint whose parameters do not fit the saved config
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    cfg_text = (bad / "config.yaml").read_text()
    assert "  dim: 128\n" in cfg_text
    (bad / "config.yaml").write_text(cfg_text.replace("  dim: 128\n", "  dim: 64\n"))
    assert main(["--checkpoint", str(bad), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and str(bad) in err[0], err


# ---- batches, row groups, the Python API, bad requests -------------------------------------
def test_prefill_in_row_groups_equals_prefill_at_once():
    """Rows prefilled in groups (out of order, different lengths) give the logits, caches and
    later decode steps of one whole-batch prefill; step waits for every row."""
    from nsa_jax.decode import DecodeError, Decoder

    model = small_lm()
    toks = jax.random.randint(jax.random.PRNGKey(0), (4, 26), 0, 97)   # > l, l', w: all caches
    lengths = [26, 7, 19, 1]
    whole = Decoder(model, 4, 32)
    want = np.asarray(whole.prefill(toks, lengths))
    parts = Decoder(model, 4, 32)
    got = np.zeros_like(want)
    got[[3, 1]] = parts.prefill_rows([3, 1], toks[jnp.array([3, 1])], [1, 7])
    with pytest.raises(DecodeError, match=r"rows \[0, 2\]"):
        parts.step(jnp.zeros(4, jnp.int32))
    got[[0, 2]] = parts.prefill_rows([0, 2], toks[jnp.array([0, 2])], [26, 19])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert parts.lengths == whole.lengths == lengths
    for a, b in zip(jax.tree.leaves(whole.cache), jax.tree.leaves(parts.cache)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)
    for i in range(3):
        t = (jnp.arange(4) * 5 + i) % 97
        np.testing.assert_allclose(np.asarray(parts.step(t)), np.asarray(whole.step(t)),
                                   atol=1e-4, rtol=1e-4)
    assert whole.prefill_bytes(4, 26) > 0
    again = Decoder(model, 4, 32)              # prefill executables are shared per shape
    again.prefill(toks, lengths)
    assert again.compile_s == 0 < parts.compile_s


def test_batch_of_prompts_equals_each_alone(tiny_run):
    """Greedy: a batch of prompts of different lengths gives, row by row, what each prompt gives
    alone, whether prefilled at once or one row at a time; a row stops at its own EOS; the
    Python API (load_run) returns the decoded completions and the step it loaded."""
    import nsa_jax

    run = nsa_jax.load_run(tiny_run)
    assert run.step == 2 and run.context == 64 and run.cfg.name == "tiny"
    prompts = ["The history of science", "", "Water is",
               "Once upon a time there was a very long sentence about many things"]
    ids = [run.encode(p) for p in prompts]
    assert len({len(i) for i in ids}) == 4 and ids[1] == [run.tokenizer.eos_id]
    alone = [run.generate_ids([i], 10, temperature=0)[0] for i in ids]
    assert run.generate_ids(ids, 10, temperature=0) == alone
    assert run.generate_ids(ids, 10, temperature=0, rows_per_group=1) == alone
    # per-row EOS: with a token some row first samples late as EOS, every row ends at its
    # first occurrence of it and the others run on
    k, r, eos = max((a.index(t), r, t) for r, a in enumerate(alone) for t in a)
    assert 1 <= k < 9, alone
    got = generate_batch(run.model, ids, 10, temperature=0, eos_id=eos,
                         vocab_limit=run.tokenizer.vocab_size)
    assert got == [a[:a.index(eos) + 1] if eos in a else a for a in alone]
    assert len(got[r]) == k + 1
    texts = run.generate(prompts, 10, temperature=0)
    assert texts == [run.decode(a) for a in alone]
    with pytest.raises(RequestError, match="^max_new_tokens: .*max_len=64"):
        run.generate(prompts, 60)


def _per_token_loop(model, prompts, n, **kw):
    """What generate_batch did before multi-token calls (seed 0, the same prefill and cache
    length): per token, split the key, one ``sample`` call, then one Decoder.step (none after
    the last token). Returns every row's n ids (EOS is not looked at)."""
    from nsa_jax.decode import Decoder
    from nsa_jax.request import bucket

    B, longest = len(prompts), max(len(p) for p in prompts)
    cache_len = longest + n      # generate_batch's: its default max_len caps bucket(longest + n)
    dec = Decoder(model, B, cache_len)
    toks = np.zeros((B, min(bucket(longest), cache_len)), np.int32)
    for b, p in enumerate(prompts):
        toks[b, :len(p)] = p
    logits = dec.prefill(toks, [len(p) for p in prompts])
    key, out = jax.random.PRNGKey(0), []
    for i in range(n):
        key, sub = jax.random.split(key)
        t = sample(logits, sub, **kw)
        out.append(np.asarray(t).tolist())
        if i < n - 1:
            logits = dec.step(t)
    return [list(row) for row in zip(*out)]


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0, top_k=30)],
                         ids=["greedy", "top_k"])
def test_steps_per_call_changes_nothing_but_the_calls(kw):
    """generate_batch with steps_per_call 1, 3 and 16 gives the ids of the per-token host loop
    (sample + Decoder.step) and the same on_token / on_done sequences, with an EOS that stops a
    row in the middle of a 3-token call and another row running to max_new_tokens; Timing
    counts the tokens of the calls after the first."""
    from nsa_jax.generate import Timing

    model = small_lm()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 97, n).tolist() for n in (3, 11, 6)]
    n = 10
    free = _per_token_loop(model, prompts, n, **kw)
    # EOS: an id that row r first samples at index 4 (the middle of the call covering 3..5)
    # and that some row never samples; each row keeps its ids up to its first EOS
    eos, r = next((row[4], r) for r, row in enumerate(free)
                  if row[4] not in row[:4] and any(row[4] not in o for o in free))
    want = [row[:row.index(eos) + 1] if eos in row else row for row in free]
    assert len(want[r]) == 5 and any(len(w) == n for w in want)
    calls = {}
    for k in (1, 3, 16):
        log, t = [], Timing()
        got = generate_batch(model, prompts, n, eos_id=eos, steps_per_call=k, timing=t,
                             on_token=lambda b, i: log.append(("token", b, i)),
                             on_done=lambda b, ids: log.append(("done", b, list(ids))), **kw)
        assert got == want, k
        calls[k] = log
        assert t.first_steps == min(k, n) and t.decode_tokens == 3 * (n - min(k, n)), k
    assert calls[1] == calls[3] == calls[16]
    assert [c for c in calls[1] if c[0] == "done"] == sorted(
        [("done", b, w) for b, w in enumerate(want)], key=lambda c: len(c[2]))
    assert len(calls[1]) == sum(map(len, want)) + 3
    with pytest.raises(RequestError,
                       match=r"^steps_per_call: must be >= 1 \(an integer\), got 0"):
        generate_batch(model, prompts, n, steps_per_call=0)


def _cache_row_bytes(run_dir, max_len):
    """(the weights with what a Decoder copies of them, one row of KV cache) in bytes."""
    from nsa_jax.decode import cache_bytes, init_cache
    from nsa_jax.request import decoder_copy_bytes
    from nsa_jax.train.checkpoint import load_for_inference

    _, model = load_for_inference(run_dir)
    weights = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
    return weights + decoder_copy_bytes(model), cache_bytes(jax.eval_shape(lambda: init_cache(model, 1, max_len)))


def test_cli_prefill_in_chunks_prints_the_same_text(tiny_run, capsys):
    """``--prefill-chunk`` (32 = the tiny run's nsa.sel_block) prefills a 40-token prompt in two
    chunks and prints the greedy text of a prefill at once; a length that is not a multiple of
    the unit is one line naming the flag."""
    prompt = " ".join(["the history of science and water"] * 6)
    argv = ["--checkpoint", str(tiny_run), "--prompt", prompt, "--max-new-tokens", "10",
            "--temperature", "0"]
    assert main(argv) == 0
    once = capsys.readouterr()
    assert main(argv + ["--prefill-chunk", "32"]) == 0
    chunked = capsys.readouterr()
    assert chunked.out == once.out and len(once.out) > len(prompt)
    assert "in chunks of 32 tokens" in chunked.err and "in chunks" not in once.err
    assert main(argv + ["--prefill-chunk", "48"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.strip() == ("error: --prefill-chunk: must be a positive "
                                                 "multiple of 32 tokens for this model, got 48")


@pytest.mark.parametrize("case", ["empty file", "prompt past context", "new tokens past cache",
                                  "batch too large"])
def test_bad_requests_exit_2_without_output(case, tiny_run, tmp_path, capsys):
    long_text = " ".join(["word"] * 80)                 # > 64 tokens, the run's data.seq_len
    lines = ["The history of science", "Water is", "Once upon a time"]
    argv, needle = {
        "empty file": ([], ["--prompts-file", "no prompts"]),
        "prompt past context": (["--prompt", "short", "--prompt", long_text],
                                ["--prompt:", "prompt 1 has", "--max-len=64"]),
        "new tokens past cache": (["--prompt", "hi", "--max-new-tokens", "64"],
                                  ["--max-new-tokens:", "--max-len=64", "at most 63"]),
        "batch too large": (["--max-new-tokens", "8"], ["--prompts-file:", "3 prompts need",
                                                        "at most 2 prompts fit"]),
    }[case]
    if case in ("empty file", "batch too large"):
        f = tmp_path / "prompts.txt"
        f.write_text("\n  \n" if case == "empty file" else "\n".join(lines) + "\n")
        argv = ["--prompts-file", str(f), *argv]
    if case == "batch too large":       # room for the weights and 2.5 rows of KV cache
        weights, row = _cache_row_bytes(tiny_run, 64)
        argv += ["--memory-limit", repr((weights + 2.5 * row) / 2**30)]
    assert main(["--checkpoint", str(tiny_run), *argv]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1 and err[0].startswith("error: "), cap
    assert all(n in err[0] for n in needle), err[0]


def test_load_run_reports_the_step_it_fell_back_to(tiny_run, tmp_path, capsys):
    """A newer checkpoint whose parameters fail their checksum: load_run warns, loads step 2,
    and says so in ``run.step``."""
    import json

    import nsa_jax

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.copytree(run / "checkpoints" / "2", run / "checkpoints" / "3")
    meta_file = run / "checkpoints" / "3" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    first = sorted(meta["checksums"]["params"])[0]
    meta["step"] = 3
    meta["checksums"]["params"][first] ^= 1            # step 3's params no longer match
    meta_file.write_text(json.dumps(meta))
    loaded = nsa_jax.load_run(run)
    assert loaded.step == 2 and nsa_jax.load_run(tiny_run).step == 2
    err = capsys.readouterr().err
    assert "falling back to step 2" in err and first in err


def test_cli_stops_quietly_when_stdout_reader_is_gone(tiny_run, tmp_path):
    """``generate ... | head``: stdout's pipe is closed before anything is written; the first
    write stops the run with status 1 and nothing on stderr but the CLI's own lines (before:
    a BrokenPipeError traceback)."""
    import os
    from nsa_testutil import cli_env

    r, w = os.pipe()
    os.close(r)                                    # the reader is gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "nsa_jax.generate", "--checkpoint",
                               str(tiny_run), "--prompt", "The history", "--max-new-tokens", "8",
                               "--temperature", "0"], cwd=REPO, env=cli_env(tmp_path / "cache"),
                              stdout=w, stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(w)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
