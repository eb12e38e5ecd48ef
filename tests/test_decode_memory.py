"""The decode calls' own memory (``Decoder.decode_bytes``, ``request.check_decode``): their
logits, ids and sampling temporaries (top-p sorts the vocabulary) are counted against what the
KV caches leave free before the prefill runs, with the executables ``Decoder.decode`` then
runs (a review found a 1000-prompt top-p run over the old estimate, which left them out). Uses
the tiny run of tests/test_generate.py for the CLI."""
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from nsa_jax.config import ModelConfig
from nsa_jax.decode import Decoder, cache_bytes
from nsa_jax.decode_memory import tree_bytes
from nsa_jax.generate import generate_batch, main
from nsa_jax.model import build_model
from nsa_jax.nsa import NSAConfig
from nsa_jax.request import (RequestError, bucket, check_decode, decode_calls,
                             decoder_copy_bytes)
from test_generate import tiny_run  # noqa: F401  (the session's trained run)


def _lm(vocab: int):
    mcfg = ModelConfig(vocab_size=vocab, dim=32, n_layers=1, n_heads=4, n_kv_groups=2,
                       head_dim=8, mlp_hidden=64, init_std=0.3)
    return build_model(mcfg, NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=16))


def test_decode_calls_are_the_shapes_generate_makes():
    assert decode_calls(10, 3) == [(3, True), (1, False)]        # 3 + 3 + 3 fed, then 1
    assert decode_calls(9, 3) == [(3, True), (3, False)]
    assert decode_calls(4, 16) == [(4, False)]                   # one call
    assert decode_calls(1, 1) == [(1, False)]
    assert decode_calls(5, 1) == [(1, True), (1, False)]


def test_decode_bytes_counts_logits_and_sampling_and_grows_with_batch_and_top_p():
    """A vocabulary of 4096: the logits in and out of the call are 2 x B x V float32, and top-p
    sorts them (at least one more [B,V] buffer); all of it grows with the batch."""
    V = 4096
    model = _lm(V)
    need = {}
    for B in (2, 8):
        dec = Decoder(model, B, 64)
        for top_p in (1.0, 0.9):
            n = dec.decode_bytes(4, top_p=top_p, feed_last=False)
            assert isinstance(n, int), n
            need[B, top_p] = n
        assert need[B, 1.0] >= 2 * B * V * 4                   # logits in + logits out
        # + the sort over V: so on the CPU backend, where the suite runs; XLA's GPU buffer
        # assignment can place a sort this small inside the step's temporaries
        # (bench/NOTES.md, forty-ninth session, call 4)
        assert need[B, 0.9] >= need[B, 1.0] + B * V * 4
    assert need[8, 1.0] >= need[2, 1.0] + 6 * 2 * V * 4           # 6 more rows of logits
    assert need[8, 0.9] - need[8, 1.0] > need[2, 0.9] - need[2, 1.0]


def test_decode_runs_the_executable_decode_bytes_compiled():
    """decode_bytes before the prefill (as generate checks it), then the prefill and the decode
    call with generate's arguments: the call compiles nothing more, and gives what a Decoder
    that never ran decode_bytes gives."""
    model = _lm(97)
    kw = dict(temperature=0.7, top_k=0, top_p=0.8125, vocab_limit=90, eos_id=5)   # unseen
    toks = np.asarray(jax.random.randint(jax.random.PRNGKey(0), (3, 13), 0, 90))
    lengths = [13, 4, 9]
    dec = Decoder(model, 3, 32)
    before = dec.compile_s
    assert dec.decode_bytes(3, feed_last=False, **kw) > 0
    assert dec.compile_s > before                          # it compiled the call...
    logits = dec.prefill(toks, lengths)
    compiled = dec.compile_s
    ids, *_ = dec.decode(logits, 3, jax.random.PRNGKey(1), feed_last=False, **kw)
    assert dec.compile_s == compiled                       # ...which decode then ran
    other = Decoder(model, 3, 32)
    want, *_ = other.decode(other.prefill(toks, lengths), 3, jax.random.PRNGKey(1),
                            feed_last=False, **kw)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want))


def _spy(monkeypatch):
    """(events, seconds): every compile of a Decoder call ("compile", kind) and every
    ``prefill_rows`` in order; the compile seconds per kind of call."""
    from nsa_jax import decode as D

    events, seconds = [], {"prefill": 0.0, "decode": 0.0}
    compiled, prefill_rows = D.Decoder._compiled, D.Decoder.prefill_rows

    def spy_compiled(self, key, lower):
        if (self.graphdef, self._sig, self.max_len) + key not in D._EXECS:
            events.append(("compile", key[0]))
        s0 = self.compile_s
        out = compiled(self, key, lower)
        seconds[key[0]] += self.compile_s - s0
        return out

    def spy_prefill(self, *a, **k):
        events.append(("prefill", None))
        return prefill_rows(self, *a, **k)

    monkeypatch.setattr(D.Decoder, "_compiled", spy_compiled)
    monkeypatch.setattr(D.Decoder, "prefill_rows", spy_prefill)
    return events, seconds


def test_generate_compiles_its_decode_calls_only_before_the_prefill(monkeypatch):
    """With memory to check, generate_batch compiles each decode call shape (steps per call,
    the shorter last one) before the first prefill, and none after; the timing still charges
    those compile seconds to the decode calls, not to the prefill."""
    from nsa_jax.generate import Timing

    events, seconds = _spy(monkeypatch)
    model = _lm(97)
    t = Timing()
    generate_batch(model, [[1, 2, 3], [4, 5]], 7, steps_per_call=3, top_p=0.6875, seed=2,
                   memory_limit=1 << 30, timing=t)
    first = events.index(("prefill", None))
    assert events[:first].count(("compile", "decode")) == 2, events     # 3 steps, then 1
    assert ("compile", "decode") not in events[first:], events
    assert 0 < t.first_compile_s < t.first_step_s and t.decode_compile_s > 0
    assert t.prefill_compile_s == pytest.approx(seconds["prefill"]) and seconds["prefill"] > 0
    assert t.first_compile_s + t.decode_compile_s == pytest.approx(seconds["decode"])


def test_compile_seconds_of_a_call_an_eos_made_moot_are_still_counted(monkeypatch):
    """The memory check compiles the shorter last call before the prefill; when EOS ends the
    generation after the first call, that call never runs, and its compile seconds still go
    to ``decode_compile_s``: first + decode compile = every decode compile second."""
    from nsa_jax.generate import Timing

    model = _lm(97)
    eos = generate_batch(model, [[1, 2, 3]], 1, temperature=0.0)[0][0]    # greedy's first id
    events, seconds = _spy(monkeypatch)
    t = Timing()
    out = generate_batch(model, [[1, 2, 3]], 7, steps_per_call=3, temperature=0.0,
                         eos_id=eos, memory_limit=1 << 30, timing=t)
    assert out == [[eos]]
    assert events.count(("compile", "decode")) == 2, events    # (3, fed) ran, (1, last) did not
    assert t.decode_compile_s > 0
    assert t.first_compile_s + t.decode_compile_s == pytest.approx(seconds["decode"])


def _fake(batch, need):
    """A Decoder with a 1000-byte cache whose decode calls need ``need(steps, feed_last)``."""
    return SimpleNamespace(batch=batch, cache={"layers": [np.zeros(1000, np.uint8)]},
                           compile_s=0.0,
                           decode_bytes=lambda steps, feed_last, **kw: need(steps, feed_last))


def _arg(fn, *a, **kw):
    with pytest.raises(RequestError) as e:
        fn(*a, **kw)
    return e.value.arg, str(e.value)


def test_check_decode_names_the_prompts_or_the_steps_per_call():
    rows = _fake(4, lambda steps, feed: 400 + steps)              # the batch dominates
    assert check_decode(rows, 10, 4, None) == {}                  # no limit known: nothing
    assert check_decode(rows, 10, 4, 1000 + 404) == {(4, True): 0.0, (2, False): 0.0}
    arg, msg = _arg(check_decode, rows, 10, 4, 1000 + 403)
    assert arg == "prompts" and msg.endswith("needs 404 B: at most 3 prompts fit"), msg
    assert "4 prompts' KV caches (1000 B) leave 403 B of 1.4 KiB free" in msg, msg
    arg, msg = _arg(check_decode, _fake(1, lambda s, f: 400), 10, 4, 1000 + 300)
    assert arg == "prompts" and "not even one prompt fits" in msg, msg
    ids = _fake(4, lambda steps, feed: 100 * steps)               # the ids [B, steps] dominate
    arg, msg = _arg(check_decode, ids, 10, 8, 1000 + 500)
    assert arg == "steps_per_call" and "8 tokens per call needs 800 B" in msg, msg
    assert "1 token per call needs 100 B: a steps_per_call below 8 fits" in msg, msg
    assert msg.endswith("(at 8, at most 3 prompts fit)"), msg
    msg = _arg(check_decode, ids, 3, 8, 1000 + 250)[1]                 # one call of 3 steps
    assert msg.startswith("steps_per_call: decoding 4 prompt(s) 3 tokens per call needs 300 B")
    assert "a steps_per_call below 3 fits" in msg, msg    # not "smaller": 7 would change nothing
    assert _arg(check_decode, ids, 1, 8, 1000 + 50)[0] == "prompts"    # 1 step: no fewer
    assert _arg(check_decode, ids, 10, 8, 1000 + 99)[0] == "prompts"   # 1 step does not fit
    assert check_decode(_fake(4, lambda s, f: None), 10, 4, 0) == {(4, True): 0.0}  # no analysis


def _kept(model) -> int:
    """The weights and what a Decoder copies of them: what ``free_memory`` takes off a limit."""
    return (sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
            + decoder_copy_bytes(model))


def test_cli_refuses_a_decode_call_that_does_not_fit(tiny_run, tmp_path, capsys, monkeypatch):
    """A memory limit holding the weights, the KV caches and the prefill but not the decode
    call (its [B, 50304] logits and the top-p sort): one line naming the prompts file with the
    need, the free bytes and how many prompts fit, exit 2, nothing on stdout, no prefill run.
    Above the decode call's need the same request generates."""
    import nsa_jax

    run = nsa_jax.load_run(tiny_run)
    lines = ["The history of science", "Water is", "Once upon a time"]
    ids = [run.encode(p) for p in lines]
    new, B = 8, len(ids)
    longest = max(map(len, ids))
    cache_len = min(bucket(longest + new), run.context)          # generate's shapes
    width = min(bucket(longest), cache_len)
    dec = Decoder(run.model, B, cache_len)
    sampling = dict(temperature=1.0, top_k=0, top_p=0.9, vocab_limit=run.tokenizer.vocab_size,
                    eos_id=run.tokenizer.eos_id)
    prefill = dec.prefill_bytes(B, width)
    decode = max(dec.decode_bytes(s, feed_last=f, **sampling) for s, f in decode_calls(new, 16))
    assert prefill < decode, (prefill, decode)
    caches = cache_bytes(dec.cache)
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(lines) + "\n")
    argv = ["--checkpoint", str(tiny_run), "--prompts-file", str(f), "--max-new-tokens",
            str(new), "--top-p", "0.9", "--memory-limit"]

    def limit(extra):
        return repr((_kept(run.model) + caches + extra) / 2 ** 30)

    with monkeypatch.context() as m:
        m.setattr(Decoder, "prefill_rows", lambda *a, **k: pytest.fail("prefill ran"))
        assert main(argv + [limit((prefill + decode) // 2)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1, cap
    assert err[0].startswith("error: --prompts-file: 3 prompts' KV caches") and (
        "decoding them 8 tokens per call needs" in err[0] and "prompts fit" in err[0]), err[0]
    assert main(argv + [limit(decode)]) == 0
    assert capsys.readouterr().out.count("=== prompt") == 3


def test_prefill_bytes_counts_the_inputs_the_call_takes_beyond_the_state():
    """The prefill's need holds its new inputs (tokens, lengths; a g-row cache below the batch)
    on top of what the analysis says it writes and holds: XLA drops the state arrays a prefill
    does not read (the decode step's fused weights) from its arguments, so "argument size less
    the whole state" came out below the tokens alone (a review measured 3,072 B too little)."""
    model = _lm(97)
    dec = Decoder(model, 2, 64)
    B, width = 2, 48
    for rows in (B, 1):
        need = dec.prefill_bytes(rows, width)
        m = dec._exec(rows, width, False).memory_analysis()
        written = m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        inputs = rows * width * 4 + rows * 4
        if rows < B:
            inputs += tree_bytes(dec._cache_shape(rows))     # the g-row cache, every array
        assert need == written + inputs, (rows, need, written, inputs)
