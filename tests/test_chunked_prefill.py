"""Chunked prefill (issue 14): a prompt taken ``chunk`` tokens at a time gives the logits, the
caches and the later decode steps of one prefill, and generation falls back to it when a
prompt's prefill does not fit in memory at once."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsa_jax.decode import DecodeError, Decoder
from nsa_jax.nsa import NSAConfig, chunked
from nsa_jax.nsa.chunked import dense_chunk_attention, nsa_chunk_attention, query_block
from nsa_jax.nsa.decoding import dense_decode_attention, nsa_decode_attention
from nsa_jax.request import RequestError, chunk_sizes, fit_prefill
from nsa_testutil import chunk_inputs, rel_err
from test_decode import _forward_logits, _max_rel, _model

# (attention, nsa overrides, chunks, query block): l=8, d=4, l'=16, w=16 unless overridden;
# prompt lengths below straddle chunk ends, compressed-block ends and the window; a query block
# of 8 runs the chunks' attention block after block (chunked.QUERY_BLOCK).
CASES = [
    ("nsa", {}, (16, 32, 48), None),
    ("nsa", {}, (32,), 8),
    ("nsa", dict(block_l=4, stride_d=4, sel_block=8, n_sel=3, window=5, n_init=0, n_local=1),
     (8, 24), None),
    ("nsa", dict(branches=("slc", "win")), (16,), None),
    ("nsa", dict(branches=("cmp",)), (32,), None),
    ("nsa", dict(window=40), (16,), None),        # the window longer than a chunk
    ("nsa", dict(window=40), (32,), 8),
    ("nsa", dict(window=200), (32,), None),       # the window past max_len: a ring of max_len
    ("dense", {}, (64,), None),
    ("dense", {}, (64,), 8),
]
LENGTHS = [70, 5, 32, 47]          # one row ends inside the first chunk, one on a chunk's end


@pytest.mark.parametrize("attention,nsa,chunks,q_block", CASES,
                         ids=["nsa", "nsa-qb8", "nsa-l=d", "nsa-slc-win", "nsa-cmp", "nsa-w>chunk",
                              "nsa-w>chunk-qb8", "nsa-w>max_len", "dense", "dense-qb8"])
def test_chunked_prefill_equals_the_forward_and_then_decodes(attention, nsa, chunks, q_block,
                                                             monkeypatch):
    """Every prompt position's logits, each row's last-token logits, and 12 decode steps after
    it equal the full forward (float32), for rows of different lengths (right-padded with junk)."""
    if q_block:
        monkeypatch.setattr(chunked, "QUERY_BLOCK", q_block)
    model = _model(attention, **nsa)
    T, P = 90, max(LENGTHS)
    B = len(LENGTHS)
    toks = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 97)
    want = _forward_logits(model, toks)
    junk = jax.random.randint(jax.random.PRNGKey(9), (B, P), 0, 97)
    prompt = jnp.where(jnp.arange(P) < jnp.asarray(LENGTHS)[:, None], toks[:, :P], junk)
    rows = np.arange(B)
    for chunk in chunks:
        dec = Decoder(model, B, T)
        got = np.asarray(dec.prefill(prompt, LENGTHS, all_logits=True, chunk=chunk))
        assert got.shape == (B, P, want.shape[-1])
        for b, n in enumerate(LENGTHS):
            assert _max_rel(got[b, :n], want[b, :n]) <= 1e-4, (chunk, b)
        last = Decoder(model, B, T)
        got = np.asarray(last.prefill(prompt, LENGTHS, chunk=chunk))
        assert rel_err(got, want[rows, np.asarray(LENGTHS) - 1]) <= 1e-4, chunk
        assert last.lengths == LENGTHS and list(np.asarray(last.cache["pos"])) == LENGTHS
        for k in range(12):
            pos = np.asarray(LENGTHS) + k
            assert _max_rel(np.asarray(last.step(toks[rows, pos])), want[rows, pos]) <= 1e-4, k


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_chunked_prefill_fills_the_caches_of_one_prefill(attention):
    """Every cache slot a valid position can see holds what one prefill writes: selection keys
    up to each row's length, the compressed blocks that end inside it, the rings exactly; and
    a row's cache past its own tokens is never written by a later chunk."""
    model = _model(attention)
    B, P, T = 4, max(LENGTHS), 96
    toks = jax.random.randint(jax.random.PRNGKey(3), (B, P), 0, 97)
    whole, parts = Decoder(model, B, T), Decoder(model, B, T)
    whole.prefill(toks, LENGTHS)
    parts.prefill(toks, LENGTHS, chunk=16 if attention == "nsa" else 64)
    cfg = model.ncfg
    for lw, lp in zip(whole.cache["layers"], parts.cache["layers"]):
        assert lw.keys() == lp.keys()
        for name in lw:
            a, b = np.asarray(lw[name]), np.asarray(lp[name])
            for r, n in enumerate(LENGTHS):
                if name in ("k", "v", "k_slc", "v_slc"):
                    sl = slice(0, n)
                elif name in ("k_cmp", "v_cmp"):
                    sl = slice(0, cfg.num_cmp_blocks(n))
                else:                                  # rings and counters: every slot
                    sl = slice(None)
                np.testing.assert_allclose(b[r, :, sl], a[r, :, sl], rtol=1e-5, atol=1e-5,
                                           err_msg=f"{name} row {r}")
            if name in ("k_slc", "v_slc"):             # row 1 (5 tokens): past it, untouched
                assert not np.any(b[1, :, 16:]), name


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_gpu_chunked_prefill_with_pallas_first_chunk(attention):
    """On the GPU: every chunk through the Pallas kernels (float32, IEEE dots; the continuation
    chunks with a query offset, ``pallas.chunk``), then decode steps: all equal the full Pallas
    forward. In bfloat16 both prefills are compared with the float32 forward of the same
    parameters: the chunked one is as close to it as the prefill at once (within 25%; the two
    paths round differently, and a near-tie top-n may flip in either)."""
    from nsa_jax.config import ExecConfig, ModelConfig
    from nsa_jax.model import build_model

    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 300), 0, 256)
    lengths = [277, 150]
    rows = np.arange(2)
    errs = {}
    for dtype in ("float32", "bfloat16"):
        mcfg = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4, n_kv_groups=2,
                           head_dim=32, mlp_hidden=256, attention=attention, init_std=0.3,
                           compute_dtype=dtype)
        model = build_model(mcfg, NSAConfig(block_l=32, stride_d=16, sel_block=64, n_sel=4,
                                            window=64), 0, ExecConfig(nsa_impl="pallas"))
        dec = Decoder(model, 2, 300)
        got = np.asarray(dec.prefill(toks[:, :277], lengths, all_logits=True, chunk=128))
        if dtype == "float32":
            want = _forward_logits(model, toks)      # highest precision: tests/conftest.py
            for b, n in enumerate(lengths):
                assert _max_rel(got[b, :n], want[b, :n]) <= 1e-4, b
            for k in range(8):
                pos = np.asarray(lengths) + k
                assert _max_rel(np.asarray(dec.step(toks[rows, pos])), want[rows, pos]) <= 1e-4
            continue
        once = np.asarray(Decoder(model, 2, 300).prefill(toks[:, :277], lengths,
                                                         all_logits=True))
        for name, x in (("chunked", got), ("once", once)):
            errs[name] = rel_err(np.concatenate([x[b, :n] for b, n in enumerate(lengths)]),
                                 np.concatenate([want[b, :n] for b, n in enumerate(lengths)]))
    print(f"bf16 relative RMSE against the float32 forward ({attention}): {errs}")
    assert errs["chunked"] <= 1.25 * errs["once"], errs


def test_chunk_attention_equals_the_decode_attention_of_each_query():
    """nsa_chunk_attention over caches holding a chunk (and dense_chunk_attention over several
    key blocks, one partial) equals the one-query decode attention at each position."""
    cfg = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=4, window=12)
    B, G, h, D, S, C, start = 2, 2, 3, 8, 64, 16, 32
    ks = jax.random.split(jax.random.PRNGKey(0), 8)
    q = jax.random.normal(ks[0], (B, C, G * h, D))
    lc = {n: jax.random.normal(k, (B, G, S, D)) for n, k in
          zip(("k_cmp", "v_cmp", "k_slc", "v_slc"), ks[1:5])}
    kw, vw = (jax.random.normal(k, (B, G, 12 + C, D)) for k in ks[5:7])
    gates = jax.nn.sigmoid(jax.random.normal(ks[7], (B, C, G * h, 3)))
    t = start + jnp.arange(C)
    span_pos = start - 12 + jnp.arange(12 + C)
    got = nsa_chunk_attention(q, lc, (kw, vw, span_pos), t, gates, cfg)
    blocks = nsa_chunk_attention(q, lc, (kw, vw, span_pos), t, gates, cfg, q_block=4)
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(got), rtol=1e-6, atol=1e-6)
    assert query_block(16, 4) == 4 and query_block(48, 4) == 3 and query_block(16) == 16
    for j in range(C):
        ring = {n: jnp.zeros((B, G, 12, D)) for n in ("k_win", "v_win")}
        for p in range(int(t[j]) - 11, int(t[j]) + 1):     # the ring after position t[j]
            ring["k_win"] = ring["k_win"].at[:, :, p % 12].set(kw[:, :, p - start + 12])
            ring["v_win"] = ring["v_win"].at[:, :, p % 12].set(vw[:, :, p - start + 12])
        want = nsa_decode_attention(q[:, j], {**lc, **ring}, t[j], gates[:, j], cfg)
        np.testing.assert_allclose(np.asarray(got[:, j]), np.asarray(want), rtol=2e-5,
                                   atol=2e-5, err_msg=str(j))
    k, v = lc["k_slc"][..., :50, :], lc["v_slc"][..., :50, :]
    got = dense_chunk_attention(q, k, v, t, key_block=16)    # 4 key blocks, the last partial
    blocks = dense_chunk_attention(q, k, v, t, key_block=16, q_block=8)
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(got), rtol=1e-6, atol=1e-6)
    for j in range(C):
        want = dense_decode_attention(q[:, j], k, v, t[j])
        np.testing.assert_allclose(np.asarray(got[:, j]), np.asarray(want), rtol=2e-5,
                                   atol=2e-5, err_msg=str(j))


# (nsa overrides, chunk start, ring length W, cache length S): l=8, d=4, l'=16 unless overridden
PALLAS_CASES = [
    (dict(window=12), 64, 12, 128),
    (dict(window=12), 16, 12, 128),                  # span keys before token 0 (W > start)
    (dict(window=40), 16, 40, 128),                  # the window longer than the chunk
    (dict(block_l=4, stride_d=4, sel_block=8, n_sel=3, window=5, n_init=0, n_local=1), 24, 5,
     128),
    (dict(branches=("slc", "win")), 48, 16, 128),
    (dict(branches=("cmp",)), 32, 16, 128),
    (dict(window=12), 384, 12, 512),    # 32 selection blocks: wider than the rows' top-n bucket
    (dict(window=12), 64, 12, 512),     # 32 blocks of which the chunk sees 6: the 16-wide bucket
    (dict(window=12), 240, 12, 512),    # rows that see 16 blocks (16 wide) and 17 (32 wide)
]
PALLAS_IDS = ["start>W", "start<W", "w>chunk", "l=d", "slc-win", "cmp", "Ts=32", "Ts=32-narrow",
              "Ts=32-mixed"]
# the block-major selection forward (what "auto" takes at bf16 and h <= 8) on the cases where
# the selection runs; float32 here, so "auto" would take the query-major one
BLOCK_CASES = [c for c, i in zip(PALLAS_CASES, PALLAS_IDS) if i not in ("cmp", "start<W")]


@pytest.mark.parametrize("sel_fwd,nsa,start,W,S",
                         [("query", *c) for c in PALLAS_CASES]
                         + [("block", *c) for c in BLOCK_CASES],
                         ids=[f"query-{i}" for i in PALLAS_IDS]
                         + [f"block-{i}" for i in PALLAS_IDS if i not in ("cmp", "start<W")])
def test_pallas_chunk_equals_the_jax_numpy_chunk(sel_fwd, nsa, start, W, S):
    """The Pallas continuation chunk (the training kernels with a query offset, interpret mode)
    equals the jax.numpy one in float32, NSA over random caches with h = 3 heads per group
    (the selection on the query-major or the block-major forward), and dense over a cache
    longer than the chunk's last position."""
    from nsa_jax.nsa.options import KernelChoices
    from nsa_jax.pallas.chunk import dense_chunk_pallas, nsa_chunk_pallas
    cfg = NSAConfig(**{**dict(block_l=8, stride_d=4, sel_block=16, n_sel=4), **nsa})
    q, lc, span, t, gates = chunk_inputs(start, cfg, 2, 2, 3, 8, 32, S, W, start)
    want = nsa_chunk_attention(q, lc, span, t, gates, cfg)
    got = nsa_chunk_pallas(q, lc, span, t, gates, cfg, choices=KernelChoices(sel_fwd=sel_fwd))
    assert rel_err(got, want) <= 2e-5 and _max_rel(np.asarray(got), np.asarray(want)) <= 2e-5
    if sel_fwd == "block":   # the dense chunk has no selection: checked once, with "query"
        return
    want = dense_chunk_attention(q, lc["k_slc"], lc["v_slc"], t)
    got = dense_chunk_pallas(q, lc["k_slc"], lc["v_slc"], t)
    assert _max_rel(np.asarray(got), np.asarray(want)) <= 2e-5


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_chunked_prefill_on_pallas_equals_the_forward(attention):
    """With ``exec.nsa_impl = "pallas"`` (interpret mode here) every chunk of a chunked prefill
    runs on the Pallas kernels and every prompt position's logits equal the full forward of the
    same parameters on the reference (float32)."""
    from nsa_jax.config import ExecConfig, ModelConfig
    from nsa_jax.model import build_model
    from test_decode import SMALL
    mcfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, head_dim=8,
                       mlp_hidden=64, attention=attention, init_std=0.3)
    model = build_model(mcfg, NSAConfig(**SMALL), 0, ExecConfig(nsa_impl="pallas"))
    B, T, P = len(LENGTHS), 90, max(LENGTHS)
    toks = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 97)
    want = _forward_logits(build_model(mcfg, NSAConfig(**SMALL), 0), toks)
    got = np.asarray(Decoder(model, B, T).prefill(toks[:, :P], LENGTHS, all_logits=True,
                                                  chunk=16 if attention == "nsa" else 64))
    for b, n in enumerate(LENGTHS):
        assert _max_rel(got[b, :n], want[b, :n]) <= 1e-4, b


def test_chunk_argument_errors_and_memory():
    model = _model("nsa")
    dec = Decoder(model, 1, 128)
    toks = jnp.zeros((1, 100), jnp.int32)
    for bad in (0, 8, 20, -16):
        with pytest.raises(DecodeError, match=f"multiple of 16 tokens, got {bad}"):
            dec.prefill(toks, chunk=bad)
    assert dec.chunk_unit == 16 and Decoder(_model("dense"), 1, 64).chunk_unit == 64
    whole = dec.prefill_bytes(1, 100)
    assert dec.prefill_bytes(1, 100, chunk=128) == whole       # >= the width: at once
    assert 0 < dec.prefill_bytes(1, 100, chunk=16) < whole
    np.testing.assert_allclose(np.asarray(dec.prefill(toks, chunk=112)),
                               np.asarray(Decoder(model, 1, 128).prefill(toks)), rtol=1e-6)


def _fake(batch, cache_bytes, need):
    """A Decoder stand-in: ``need(g, width, chunk)`` bytes per prefill."""
    return SimpleNamespace(batch=batch, chunk_unit=16, cache={"layers": [np.zeros(cache_bytes,
                                                                                  np.uint8)]},
                           prefill_bytes=lambda g, w, chunk=None: need(g, w, chunk))


def test_fit_prefill_chunks_only_where_one_row_does_not_fit():
    assert chunk_sizes(SimpleNamespace(chunk_unit=16), 100) == [64, 32, 16]
    assert chunk_sizes(SimpleNamespace(chunk_unit=16), 16) == []

    def need(g, w, chunk):
        return 10 * g * (chunk or w)
    dec = _fake(2, 1000, need)
    assert fit_prefill(dec, 128, 1000 + 2560, 100) == (2, None)      # both rows at once
    assert fit_prefill(dec, 128, 1000 + 1280, 100) == (1, None)      # a row at a time
    assert fit_prefill(dec, 128, 1000 + 1279, 100) == (1, 64)        # the largest chunk
    assert fit_prefill(dec, 128, 1000 + 200, 100) == (1, 16)
    assert fit_prefill(dec, 128, 1000 + 2560, 100, chunk=32) == (2, 32)   # as asked
    tried = []

    def counted(g, w, chunk):
        tried.append(chunk)
        return need(g, w, chunk)
    wide = _fake(1, 1000, counted)                                   # 16 chunk lengths
    assert fit_prefill(wide, 1 << 20, 1000 + 10 * 4096, 100) == (1, 4096)
    assert tried[0] is None and tried[1] == 16 and len(tried) <= 2 + 4, tried   # binary search
    with pytest.raises(RequestError) as e:                           # not even the smallest
        fit_prefill(_fake(1, 1000, need), 128, 1000 + 159, 100)
    assert e.value.arg == "prompts" and "even in chunks of 16 tokens" in str(e.value)
    with pytest.raises(RequestError) as e:                           # fewer rows would fit
        fit_prefill(_fake(4, 1000, need), 128, 1000 + 100, 100)
    assert "in chunks of 16 tokens needs 160 B: at most 3 prompts fit" in str(e.value)


def test_generate_falls_back_to_chunks_with_the_same_ids():
    """A memory limit that leaves room for a chunked prefill but not for the whole one:
    generation prefills the prompt in chunks (the largest that fits) and samples the ids it
    samples without the limit; ``prefill_chunk`` forces a chunk; a bad one is one RequestError
    naming it."""
    from nsa_jax.decode import cache_bytes
    from nsa_jax.generate import Timing, generate_batch
    from nsa_jax.request import free_memory

    model = _model("nsa")
    prompt = [int(x) for x in jax.random.randint(jax.random.PRNGKey(4), (150,), 0, 97)]
    kw = dict(temperature=0.8, seed=3)
    want = generate_batch(model, [prompt], 8, **kw)
    dec = Decoder(model, 1, 192)                 # generate's cache: bucket(150 + 8) = 192
    whole, half = dec.prefill_bytes(1, 192), dec.prefill_bytes(1, 192, chunk=64)
    assert half < whole
    kept = (1 << 30) - free_memory(model, 1 << 30)          # the weights and the decoder's copy
    limit = kept + cache_bytes(dec.cache) + half
    t = Timing()
    assert generate_batch(model, [prompt], 8, memory_limit=limit, timing=t, **kw) == want
    assert t.chunk == 64 and "in chunks of 64 tokens" in t.lines()[0]
    t = Timing()
    assert generate_batch(model, [prompt], 8, prefill_chunk=32, timing=t, **kw) == want
    assert t.chunk == 32
    with pytest.raises(RequestError) as e:
        generate_batch(model, [prompt], 8, prefill_chunk=24, **kw)
    assert e.value.arg == "prefill_chunk" and "multiple of 16" in str(e.value)
