"""Tests for the torch-free data pipeline (nsa_jax/data)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nsa_jax.config import config_from_dict
from nsa_jax.data import DataError, build_loader, get_tokenizer


def make_cfg(vocab=256, seed=0, **data):
    return config_from_dict({"model": {"vocab_size": vocab}, "train": {"seed": seed},
                             "data": data})


def take(loader, n):
    return [next(loader) for _ in range(n)]


def assert_resume_exact(cfg, split="train", batch_size=3, n_before=3, n_after=4, **kw):
    """Batches after a restore from state() equal an uninterrupted loader's batches."""
    with build_loader(cfg, split=split, batch_size=batch_size, **kw) as full:
        ref = take(full, n_before + n_after)
    with build_loader(cfg, split=split, batch_size=batch_size, **kw) as first:
        head = take(first, n_before)
        state = json.loads(json.dumps(first.state()))
    with build_loader(cfg, split=split, batch_size=batch_size, state=state, **kw) as second:
        tail = take(second, n_after)
    for a, b in zip(head + tail, ref):
        np.testing.assert_array_equal(a, b)
    return ref


def conditional_entropy_bits(tokens: np.ndarray, vocab: int) -> float:
    """H(next | prev) estimated from bigram counts."""
    prev, nxt = tokens[:-1].astype(np.int64), tokens[1:].astype(np.int64)
    joint = np.bincount(prev * vocab + nxt, minlength=vocab * vocab).reshape(vocab, vocab)
    p_joint = joint / joint.sum()
    p_prev = p_joint.sum(1, keepdims=True)
    nz = p_joint > 0
    return float(-(p_joint[nz] * np.log2((p_joint / np.maximum(p_prev, 1e-30))[nz])).sum())


# ---- synthetic ---------------------------------------------------------------------------
def test_synthetic_shape_dtype_range_and_determinism():
    cfg = make_cfg(vocab=512, source="synthetic", seq_len=40, synthetic_vocab=100)
    with build_loader(cfg, batch_size=4) as a, build_loader(cfg, batch_size=4) as b:
        xa, xb = take(a, 3), take(b, 3)
    for x, y in zip(xa, xb):
        assert x.shape == (4, 41) and x.dtype == np.int32
        assert x.min() >= 0 and x.max() < 100
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(xa[0], xa[1])
    other_seed = make_cfg(vocab=512, seed=1, source="synthetic", seq_len=40, synthetic_vocab=100)
    with build_loader(other_seed, batch_size=4) as c:
        assert not np.array_equal(next(c), xa[0])


def test_synthetic_has_learnable_low_entropy_structure():
    vocab = 64
    cfg = make_cfg(vocab=vocab, source="synthetic", seq_len=255)
    with build_loader(cfg, batch_size=64) as loader:
        toks = np.concatenate([b.ravel() for b in take(loader, 4)])
    with build_loader(cfg, split="eval", batch_size=64) as loader:
        ev = np.concatenate([b.ravel() for b in take(loader, 2)])
    # bigram conditional entropy well below a uniform stream's (measured ~3.0 vs ~6.0 bits)
    h = conditional_entropy_bits(toks, vocab)
    control = conditional_entropy_bits(
        np.random.default_rng(0).integers(0, vocab, toks.size), vocab)
    assert control > 5.5            # uniform: ~log2(64) = 6 bits (minus estimator bias)
    assert h < 0.6 * control, (h, control)
    # a trigram table fit on train predicts held-out eval tokens far above chance (1/64);
    # measured ~0.73: the structure is shared by the splits, so it is learnable
    ctx = toks[:-2].astype(np.int64) * vocab + toks[1:-1]
    table = np.zeros((vocab * vocab, vocab), np.int64)
    np.add.at(table, (ctx, toks[2:]), 1)
    pred = table.argmax(1)[ev[:-2].astype(np.int64) * vocab + ev[1:-1]]
    assert (pred == ev[2:]).mean() > 0.5


def test_synthetic_resume_eval_and_processes():
    cfg = make_cfg(source="synthetic", seq_len=32, prefetch=3)
    ref = assert_resume_exact(cfg)
    with build_loader(cfg, split="eval", batch_size=3) as ev:
        e = next(ev)
    assert not any(np.array_equal(e, r) for r in ref)
    # batch size may change across a restore: state counts sequences, not batches
    with build_loader(cfg, batch_size=2) as a:
        rows = np.concatenate(take(a, 3))
    with build_loader(cfg, batch_size=3) as b:
        next(b)
        st = b.state()
    with build_loader(cfg, batch_size=3, state=st) as c:
        np.testing.assert_array_equal(next(c), rows[3:6])
    p0 = build_loader(cfg, batch_size=4, process_index=0, process_count=2)
    p1 = build_loader(cfg, batch_size=4, process_index=1, process_count=2)
    a, b = next(p0), next(p1)
    p0.close(), p1.close()
    assert not any(np.array_equal(x, y) for x in a for y in b)


def test_synthetic_errors():
    with pytest.raises(DataError, match=r"data.synthetic_vocab: 300 > model.vocab_size 256"):
        build_loader(make_cfg(source="synthetic", synthetic_vocab=300), batch_size=1)
    cfg = make_cfg(source="synthetic", seq_len=16)
    with build_loader(cfg, batch_size=2) as a:
        next(a)
        st = a.state()
    with pytest.raises(DataError, match=r"data state: saved with split='train'"):
        build_loader(cfg, split="eval", batch_size=2, state=st)
