"""The generation path's contracts that a mutation survey found unchecked: sampling filters
(vocabulary padding, temperature below 1, the nucleus boundary and its order with temperature),
request limits at their exact boundaries, the memory and row-group arithmetic, the decode loop's
EOS id 0 and vocabulary padding, and the Python API (``Run``, ``load_run``) passing its
settings through. Small models and fake tokenizers only: every test runs in a few seconds."""
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nsa_jax.generate import generate_batch
from nsa_jax.inference import Run, load_run
from nsa_jax.request import (HARD_MAX_LEN, RequestError, bucket, check_memory, check_request,
                             decoder_copy_bytes, fit_rows, free_memory)
from nsa_jax.sampling import filter_logits, sample
from nsa_testutil import small_lm

V = 97   # small_lm()'s vocabulary


def _kept(x):
    """Ids left finite by filter_logits, per row."""
    return [np.flatnonzero(np.isfinite(r)).tolist() for r in np.atleast_2d(np.asarray(x))]


# ---- sampling -------------------------------------------------------------------------------
def test_vocab_limit_masks_one_padding_id_and_comes_before_top_k():
    logits = jnp.asarray([[1.0, 2.0, 3.0, 10.0]])
    # one padding id (vocab_limit = V - 1) is masked like many
    assert _kept(filter_logits(logits, vocab_limit=3)) == [[0, 1, 2]]
    assert int(sample(logits, jax.random.PRNGKey(0), temperature=0.0, vocab_limit=3)[0]) == 2
    # top-k counts real ids only: the 2 best of ids 0..4, not the padding ids 5, 6
    x = jnp.asarray([[0.0, 4.0, 1.0, 3.0, 2.0, 50.0, 40.0]])
    assert _kept(filter_logits(x, top_k=2, vocab_limit=5)) == [[1, 3]]
    # the nucleus too: ids 1 and 3 hold ~0.87 of the real mass; padding holds none of it
    assert _kept(filter_logits(x, top_p=0.85, vocab_limit=5)) == [[1, 3]]


def test_temperature_below_one_sharpens():
    x = jnp.asarray([[0.5, -1.0, 2.0, 0.0]])
    np.testing.assert_allclose(np.asarray(filter_logits(x, temperature=0.5)), np.asarray(x) * 2,
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(filter_logits(x, temperature=4.0)), np.asarray(x) / 4,
                               rtol=1e-6)
    probs = np.array([0.6, 0.3, 0.1])
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)), (20000, 3))
    ids = sample(logits, jax.random.PRNGKey(3), temperature=0.5)
    want = probs ** 2 / (probs ** 2).sum()                  # [0.783, 0.196, 0.022]
    np.testing.assert_allclose(np.bincount(np.asarray(ids), minlength=3) / 20000, want,
                               atol=0.015)


def test_nucleus_is_the_smallest_set_reaching_top_p_and_off_at_one():
    # probabilities exact in float32: the mass before each token is 0, 0.5, 0.75, 0.875
    x = jnp.log(jnp.asarray([[0.5, 0.25, 0.125, 0.125]], jnp.float32))
    assert _kept(filter_logits(x, top_p=0.5)) == [[0]]          # 0.5 reaches 0.5: id 0 alone
    assert _kept(filter_logits(x, top_p=0.75)) == [[0, 1]]
    assert _kept(filter_logits(x, top_p=0.76)) == [[0, 1, 2, 3]]  # the tie at 0.125 is kept whole
    # top_p = 1 (and top_k = 0) is off: tokens whose probability rounds to 0 stay samplable
    far = jnp.asarray([[0.0, -30.0, -30.0, -45.0]])
    np.testing.assert_array_equal(np.asarray(filter_logits(far, top_p=1.0, top_k=0)),
                                  np.asarray(far))


def test_nucleus_is_taken_after_temperature():
    # p = [0.6, 0.3, 0.1]: at temperature 3 the mass before id 1 is 0.43 < 0.55 (kept), while
    # at temperature 1 it is 0.6 (dropped)
    x = jnp.log(jnp.asarray([[0.6, 0.3, 0.1]], jnp.float32))
    assert _kept(filter_logits(x, temperature=1.0, top_p=0.55)) == [[0]]
    assert _kept(filter_logits(x, temperature=3.0, top_p=0.55)) == [[0, 1]]
    assert _kept(filter_logits(x, temperature=3.0, top_p=0.8)) == [[0, 1, 2]]


# ---- the decode loop ------------------------------------------------------------------------
def test_decode_loop_masks_padding_and_marks_eos_id_0():
    """Decoder.decode with vocab_limit and eos_id=0 gives the per-token host loop's ids (sample
    + step), never a padding id, and ``done`` for the row that sampled id 0."""
    from nsa_jax.decode import Decoder

    model = small_lm()
    toks = jnp.asarray(np.random.default_rng(1).integers(1, V, (2, 9)), jnp.int32)
    a, b = Decoder(model, 2, 24), Decoder(model, 2, 24)
    la, lb = a.prefill(toks, [9, 4]), b.prefill(toks, [9, 4])
    # both rows' best id is padding (96); row 0's best real id is 0, the EOS
    first = (la + jnp.zeros(V).at[96].set(1e4)).at[0, 0].set(9e3)
    want, logits, key = [], first, jax.random.PRNGKey(5)
    for _ in range(6):
        key, sub = jax.random.split(key)
        t = sample(logits, sub, temperature=0.0, vocab_limit=90)
        want.append(np.asarray(t))
        logits = a.step(t)
    want = np.stack(want, 1)
    del lb
    ids, _, _, done = b.decode(first, 6, jax.random.PRNGKey(5), temperature=0.0, vocab_limit=90,
                               eos_id=0)
    ids = np.asarray(ids)
    np.testing.assert_array_equal(ids, want)
    assert ids[0, 0] == 0 and ids[1, 0] == int(np.argmax(np.asarray(first)[1, :90]))
    assert (ids < 90).all()
    assert np.asarray(done).tolist() == [True, bool((want[1] == 0).any())]


# ---- request limits -------------------------------------------------------------------------
def _arg(fn, *a, **kw):
    with pytest.raises(RequestError) as e:
        fn(*a, **kw)
    return e.value.arg, str(e.value)


def test_check_request_boundaries():
    assert _arg(check_request, [], 4, 16) == ("prompts", "prompts: no prompts given")
    assert _arg(check_request, [[1]], 1, 0)[0] == "max_len"
    check_request([[1]], 1, HARD_MAX_LEN)                       # the largest context is allowed
    assert _arg(check_request, [[1]], 1, HARD_MAX_LEN + 1)[0] == "max_len"
    assert _arg(check_request, [[1]], 0, 16) == ("max_new_tokens",
                                                 "max_new_tokens: must be >= 1, got 0")
    assert _arg(check_request, [[1], []], 1, 16) == ("prompts",
                                                     "prompts: prompt 1 holds no tokens")
    # a prompt that fills the context leaves no new token: the prompt is named (no value of
    # max_new_tokens, which must be >= 1, could fix it)
    arg, msg = _arg(check_request, [[1] * 8], 1, 8)
    assert arg == "prompts" and "prompt 0 has 8 tokens, the whole context max_len=8" in msg
    check_request([[1] * 7], 1, 8)                                  # one new token fits
    assert _arg(check_request, [[1] * 7], 2, 8) == (
        "max_new_tokens", "max_new_tokens: prompt 0 (7 tokens) + 2 new tokens exceed the "
                          "context max_len=8; at most 1 new tokens fit")
    # prompt + new == context fits exactly; the longest prompt of a batch is the one checked
    check_request([[1] * 5, [2]], 3, 8)
    arg, msg = _arg(check_request, [[2], [1] * 5], 4, 8)
    assert arg == "max_new_tokens" and msg.startswith("max_new_tokens: prompt 1 (5 tokens)")
    assert "at most 3 new tokens fit" in msg
    # the same checks guard generate_batch, before anything is allocated
    model = small_lm()
    assert _arg(generate_batch, model, [], 4)[0] == "prompts"
    assert _arg(generate_batch, model, [[1, 2]], 0)[0] == "max_new_tokens"
    assert _arg(generate_batch, model, [[1, 2], []], 3)[0] == "prompts"


def test_generate_batch_fills_the_context_exactly():
    model = small_lm()
    prompts = [[5, 6, 7, 8, 9], [3]]
    got = generate_batch(model, prompts, 3, max_len=8, temperature=0.0, steps_per_call=2)
    assert [len(g) for g in got] == [3, 3]
    # greedy: the same ids as with room to spare
    assert got == generate_batch(model, prompts, 3, max_len=64, temperature=0.0)


def test_bucket_widths():
    assert [bucket(n) for n in (0, 1, 63, 64, 65, 129, 512, 513, 640, 641, 1025)] == [
        64, 64, 64, 64, 128, 192, 512, 640, 640, 768, 1280]
    for n in range(1, 5000, 7):
        b = bucket(n)
        assert b >= n and b % 64 == 0 and (n <= 512 or b - n < n / 4), n


def test_free_memory_charges_the_weights_and_the_decoder_copy():
    model = small_lm()
    weights = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model)))
    copy = decoder_copy_bytes(model)
    assert copy > 0                    # a float32 model: the fused step projections only
    assert free_memory(model, weights + copy + 12345) == 12345   # the limit caps what is free
    assert free_memory(model, weights + copy + 1) == 1
    # a limit that does not hold the weights and their copy names the limit (the caches would
    # be refused next, naming the prompts, which no prompt change could fix)
    for limit in (weights + copy, weights + copy - 10, 1):
        arg, msg = _arg(free_memory, model, limit)
        assert arg == "memory_limit" and "does not hold the weights" in msg, limit
    free = free_memory(model)
    assert free is None or free > 10 ** 6


def test_check_memory_names_what_does_not_fit():
    from nsa_jax.decode import cache_bytes, init_cache

    model = small_lm()

    def row(n):
        return cache_bytes(jax.eval_shape(lambda: init_cache(model, 1, n)))

    prompts = [[1] * 10, [2] * 3, [3]]
    check_memory(model, prompts, 192, None)                       # unknown: no check
    check_memory(model, prompts, 192, 3 * row(192))
    arg, msg = _arg(check_memory, model, prompts, 192, 3 * row(192) - 1)
    assert arg == "prompts" and "at most 2 prompts fit (by their KV caches alone" in msg, msg
    assert _arg(check_memory, model, prompts, 192, row(192) - 1)[0] == "max_new_tokens"
    assert _arg(check_memory, model, prompts, 192, row(64) - 1)[0] == "prompts"


def test_fit_rows_halves_rounding_up_within_what_the_caches_leave():
    cache = {"layers": [np.zeros(1000, np.uint8)]}
    dec = SimpleNamespace(batch=3, cache=cache, prefill_bytes=lambda g, width: 100 * g)
    assert fit_rows(dec, 64, None, 10) == 3
    assert fit_rows(dec, 64, 1000 + 300, 10) == 3
    assert fit_rows(dec, 64, 1000 + 250, 10) == 2                 # 3 -> 2 (not 1)
    assert fit_rows(dec, 64, 1000 + 100, 10) == 1
    # one row's prefill does not fit beside 3 rows of caches, but would beside 2: the count
    # that fits is what to say (forty-sixth review: "a prompt of 10 tokens" misled)
    arg, msg = _arg(fit_rows, dec, 64, 1000 + 99, 10)
    assert arg == "prompts" and "prefilling one row of 64 tokens needs 100 B" in msg, msg
    assert msg.endswith("at most 2 prompts fit"), msg
    one = SimpleNamespace(batch=1, cache=cache, prefill_bytes=lambda g, width: 100 * g)
    arg, msg = _arg(fit_rows, one, 64, 1000 + 99, 10)             # no batch size would help
    assert arg == "prompts" and "prompt of 10 tokens (padded to 64)" in msg
    dec5 = SimpleNamespace(batch=5, cache=cache, prefill_bytes=lambda g, width: 100 * g)
    assert fit_rows(dec5, 64, 1000 + 450, 10) == 3                # 5 -> 3
    none = SimpleNamespace(batch=4, cache=cache, prefill_bytes=lambda g, width: None)
    assert fit_rows(none, 64, 0, 10) == 4                         # no memory analysis


# ---- the Python API: Run, load_run -----------------------------------------------------------
class _Tok:
    """A tokenizer of ``vocab_size`` ids (the model has V = 97: the rest is padding)."""

    def __init__(self, vocab_size=40, eos_id=39):
        self.vocab_size, self.eos_id = vocab_size, eos_id

    def encode(self, text):
        return [1 + ord(c) % 30 for c in text]

    def decode(self, ids):
        return ",".join(map(str, ids))


def _run(model, seq_len=32, **tok):
    cfg = SimpleNamespace(data=SimpleNamespace(seq_len=seq_len, tokenizer="fake"),
                          model=SimpleNamespace(vocab_size=V))
    return Run(run_dir=Path("run"), cfg=cfg, model=model, tokenizer=_Tok(**tok), step=2)


def test_run_passes_vocabulary_eos_and_context():
    model = small_lm()
    prompts = [[4, 9, 2], [7]]
    # the greedy streams without EOS, over the tokenizer's 40 ids; unlimited, padding ids win
    free = generate_batch(model, prompts, 10, temperature=0.0, vocab_limit=40)
    assert all(i < 40 for row in free for i in row)
    assert generate_batch(model, prompts, 10, temperature=0.0) != free
    # an EOS that row r first samples at index 1 <= k < 9: it cuts that row short
    k, r, eos = max((row.index(t), r, t) for r, row in enumerate(free) for t in row
                    if 1 <= row.index(t) < 9)
    run = _run(model, eos_id=eos)
    want = [row[:row.index(eos) + 1] if eos in row else row for row in free]
    assert run.generate_ids(prompts, 10, temperature=0.0) == want and len(want[r]) == k + 1
    assert run.encode("") == [eos] and run.encode("ab") == [1 + 97 % 30, 1 + 98 % 30]
    assert run.decode([5, eos, 7]) == "5,7"
    # context: data.seq_len by default, max_len when given
    assert run.context == 32
    assert _arg(run.generate_ids, [[1] * 10], 30, temperature=0.0)[1].endswith(
        "at most 22 new tokens fit")
    assert len(run.generate_ids([[1] * 10], 30, temperature=0.0, max_len=40)[0]) <= 30


def test_run_passes_the_sampling_settings():
    model = small_lm()
    run = _run(model, eos_id=0)
    prompts = [[4, 9, 2], [7, 7]]
    greedy = run.generate_ids(prompts, 8, temperature=0.0)
    assert run.generate_ids(prompts, 8, temperature=1.0, top_k=1) == greedy
    assert run.generate_ids(prompts, 8, temperature=1.0, top_p=1e-6) == greedy
    sampled = run.generate_ids(prompts, 8, temperature=1.0, seed=3)
    assert sampled != greedy and sampled != run.generate_ids(prompts, 8, temperature=1.0)
    texts = ["ab", "xyz"]
    ids = run.generate_ids([run.encode(t) for t in texts], 6, temperature=1.0, seed=3)
    assert run.generate(texts, 6, temperature=1.0, seed=3) == [run.decode(x) for x in ids]
    assert run.generate(texts, 6, temperature=1.0, seed=0) != run.generate(texts, 6, seed=3)
    assert _arg(run.generate, texts, 6, memory_limit=1)[0] == "memory_limit"
    with pytest.raises(TypeError, match="one string"):
        run.generate("ab", 2)


def test_load_run_passes_the_step_and_checks_the_vocabulary(monkeypatch, tmp_path):
    import nsa_jax.data
    import nsa_jax.train.inference
    from nsa_jax.config import ConfigError

    model, calls, tok = small_lm(), [], {}
    cfg = SimpleNamespace(model=SimpleNamespace(vocab_size=V),
                          data=SimpleNamespace(tokenizer="fake", seq_len=32))

    def restore(run_dir, step=None):
        calls.append((run_dir, step))
        return cfg, model, np.int64(7 if step is None else step)

    monkeypatch.setattr(nsa_jax.train.inference, "restore_for_inference", restore)
    monkeypatch.setattr(nsa_jax.data, "get_tokenizer", lambda name: _Tok(**tok))
    run = load_run(str(tmp_path), step=5)
    assert calls[-1] == (str(tmp_path), 5)
    assert run.step == 5 and type(run.step) is int and run.run_dir == tmp_path
    assert run.model is model and run.context == 32
    assert load_run(tmp_path).step == 7 and calls[-1][1] is None
    tok.update(vocab_size=V, eos_id=V - 1)                  # as many ids as the model: fine
    assert load_run(tmp_path).tokenizer.vocab_size == V
    tok.update(vocab_size=V + 1)
    with pytest.raises(ConfigError, match=f"^data.tokenizer: 'fake' has {V + 1} tokens but "
                                          f"the model's vocab_size is {V}$"):
        load_run(tmp_path)


def test_generate_ids_refuses_what_generate_batch_refuses():
    """The batch-1 helper raises the batch API's RequestError, naming the argument, for an
    empty prompt and for max_new_tokens < 1 (it returned [] for the latter before)."""
    from nsa_jax.generate import generate_ids
    model = small_lm()
    for prompt, new, arg in (([], 4, "prompts"), ([1, 2], 0, "max_new_tokens")):
        with pytest.raises(RequestError) as e:
            generate_ids(model, prompt, new, temperature=0.0)
        assert e.value.arg == arg
    assert len(generate_ids(model, [1, 2, 3], 2, temperature=0.0)) == 2
