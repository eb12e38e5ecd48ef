"""Tests from a mutation survey of the data pipeline's token path (nsa_jax/data: documents,
tokens, shards, loader, batch, split): each one fails under a mutant that the tests in
test_data.py / test_documents.py let through, and states the exact tokens, ids or error
message a user depends on. CPU only, tiny data built in tmp_path."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nsa_jax.config import config_from_dict
from nsa_jax.data import DataError, build_loader


def make_cfg(vocab=256, seed=0, **data):
    return config_from_dict({"model": {"vocab_size": vocab}, "train": {"seed": seed},
                             "data": data})


def positional(tmp_path, n, name="pos", shard_tokens=64):
    """Shards whose token at position i is i (uint32)."""
    from nsa_jax.data.shards import write_dataset

    write_dataset(tmp_path / name, iter([np.arange(n)]), dtype="uint32",
                  shard_tokens=shard_tokens,
                  meta={"vocab_size": n, "eos_id": 0, "tokenizer": "none", "source": "test"})
    return tmp_path / name


def tokens_cfg(path, n, seq_len=10, eval_fraction=0.0, **kw):
    return make_cfg(vocab=n, source="tokens", path=str(path), seq_len=seq_len,
                    eval_fraction=eval_fraction, **kw)


def first_tokens(cfg, rows, **kw):
    with build_loader(cfg, batch_size=rows, **kw) as ld:
        return next(ld).tokens[:, 0].tolist()


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def js(text):
    return json.dumps({"text": text})


# ---- documents.py: resuming at raw document i, max_docs, field errors ---------------------------
def test_jsonl_resume_into_a_later_file_counts_only_non_blank_lines(tmp_path):
    from nsa_jax.data.documents import LocalDocs

    a = write_lines(tmp_path / "a.jsonl", [js("d0"), "", js("d1"), "   ", js("d2"), ""])
    b = write_lines(tmp_path / "b.jsonl", [js("d3"), js("d4"), js("d5")])
    docs = LocalDocs([a, b], "text")
    assert list(docs.iter_docs(0)) == [(i, f"d{i}") for i in range(6)]
    assert list(docs.iter_docs(4)) == [(4, "d4"), (5, "d5")]
    assert list(docs.iter_docs(3)) == [(3, "d3"), (4, "d4"), (5, "d5")]


def test_txt_resume_counts_one_document_per_file(tmp_path):
    from nsa_jax.data.documents import LocalDocs

    files = []
    for i in range(4):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text(f"text {i}", encoding="utf-8")
    docs = LocalDocs(files, "text")
    assert list(docs.iter_docs(2)) == [(2, "text 2"), (3, "text 3")]
    assert list(docs.iter_docs(3)) == [(3, "text 3")]


def test_max_docs_caps_documents_and_files_past_it_are_never_read(tmp_path):
    from nsa_jax.data.documents import LocalDocs

    a = write_lines(tmp_path / "a.jsonl", [js("d0"), js("d1"), js("d2")])
    b = write_lines(tmp_path / "b.jsonl", ["{broken"])      # past max_docs: never parsed
    assert list(LocalDocs([a, b], "text", max_docs=2).iter_docs()) == [(0, "d0"), (1, "d1")]
    assert list(LocalDocs([a, b], "text", max_docs=2).iter_docs(1)) == [(1, "d1")]
    assert list(LocalDocs([a, b], "text", max_docs=3).iter_docs()) == \
        [(0, "d0"), (1, "d1"), (2, "d2")]
    with pytest.raises(DataError, match=r"b.jsonl:1: invalid JSON"):
        list(LocalDocs([a, b], "text", max_docs=4).iter_docs())


def test_jsonl_non_text_field_names_file_line_and_key(tmp_path):
    from nsa_jax.data.documents import LocalDocs

    a = write_lines(tmp_path / "a.jsonl", [js("ok"), json.dumps({"text": 5})])
    with pytest.raises(DataError, match=r"^.*a.jsonl:2: field 'text' is int, not text$"):
        list(LocalDocs([a], "text").iter_docs())


def test_parquet_without_the_text_column_names_data_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nsa_jax.data.documents import LocalDocs

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["one", "two"]}), str(p))
    msg = r"d.parquet: no column 'text' \(data.text_field\); columns: body$"
    with pytest.raises(DataError, match=msg):
        LocalDocs([p], "text").check()
    with pytest.raises(DataError, match=msg):
        build_loader(make_cfg(source="text", path=str(p), tokenizer="byte", seq_len=4,
                              eval_fraction=0.0), batch_size=1)


# ---- split.py: which documents a split and a process get ------------------------------------
def test_doc_filter_assigns_eval_documents_and_processes_exactly():
    from nsa_jax.data.split import DocFilter

    def kept(split, p, P):
        f = DocFilter(split, 0.25, p, P)
        return [i for i in range(16) if f.keep(i)]

    assert kept("eval", 0, 1) == [3, 7, 11, 15]
    assert kept("train", 0, 1) == [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14]
    # the j-th document of a split goes to process j % P
    assert kept("train", 0, 2) == [0, 2, 5, 8, 10, 13]
    assert kept("train", 1, 2) == [1, 4, 6, 9, 12, 14]
    assert kept("eval", 0, 2) == [3, 11]
    assert kept("eval", 1, 2) == [7, 15]
    assert kept("train", 2, 3) == [2, 6, 10, 14]


def test_text_source_process_reads_exactly_its_documents(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [js(f"doc{i}") for i in range(16)])
    cfg = make_cfg(source="text", path=str(path), tokenizer="byte", seq_len=8,
                   eval_fraction=0.25, prefetch=0)

    def stream(docs, n):
        s = np.concatenate([list(f"doc{i}".encode()) + [0] for i in docs])
        s = np.tile(s, 8)
        return np.stack([s[r * 8: r * 8 + 9] for r in range(n)])

    with build_loader(cfg, split="eval", batch_size=3, process_index=1, process_count=2) as ld:
        np.testing.assert_array_equal(next(ld).tokens, stream([7, 15], 3))
    with build_loader(cfg, split="train", batch_size=4, process_index=0, process_count=2) as ld:
        np.testing.assert_array_equal(next(ld).tokens, stream([0, 2, 5, 8, 10, 13], 4))


# ---- tokens.py: split boundary, process striding, epochs, seed ---------------------------------
def test_tokens_eval_split_is_the_last_floor_fraction_of_tokens(tmp_path):
    n = 1005                                       # 0.1 * 1005 = 100.5 -> 100 eval tokens
    cfg = tokens_cfg(positional(tmp_path, n), n, eval_fraction=0.1, shuffle=False)
    with build_loader(cfg, split="eval", batch_size=9) as ld:
        ev = next(ld).tokens
    np.testing.assert_array_equal(ev[0], np.arange(905, 916))
    assert ev[:, 0].tolist() == list(range(905, 995, 10))
    assert first_tokens(cfg, 90) == list(range(0, 900, 10))   # (905 - 1) // 10 train windows


def test_tokens_processes_take_every_pth_window_and_wrap_epochs_together(tmp_path):
    n = 101                                        # 10 windows of 11 tokens
    cfg = tokens_cfg(positional(tmp_path, n), n, shuffle=False)
    assert first_tokens(cfg, 7, process_index=0, process_count=2) == [0, 20, 40, 60, 80, 0, 20]
    assert first_tokens(cfg, 7, process_index=1, process_count=2) == [10, 30, 50, 70, 90, 10, 30]
    # 3 windows each per epoch (10 // 3); window 9 is left out of every epoch
    assert first_tokens(cfg, 5, process_index=2, process_count=3) == [20, 50, 80, 20, 50]
    with build_loader(cfg, batch_size=3, process_index=1, process_count=2) as ld:
        next(ld)
        st = ld.state()
    assert st["cursor"] == 3
    with build_loader(cfg, batch_size=3, process_index=1, process_count=2, state=st) as ld:
        assert next(ld).tokens[:, 0].tolist() == [70, 90, 10]
    # shuffled: the processes still split every epoch's windows between them
    shuf = tokens_cfg(tmp_path / "pos", n)
    with build_loader(shuf, batch_size=5, process_index=0, process_count=2) as a, \
            build_loader(shuf, batch_size=5, process_index=1, process_count=2) as b:
        for _ in range(2):
            starts = next(a).tokens[:, 0].tolist() + next(b).tokens[:, 0].tolist()
            assert sorted(starts) == list(range(0, 100, 10))


def test_tokens_train_order_follows_the_seed(tmp_path):
    n = 401                                        # 40 windows
    path = positional(tmp_path, n)
    s0, s0b, s1 = (first_tokens(tokens_cfg(path, n, seed=s), 40) for s in (0, 0, 1))
    assert s0 == s0b
    assert sorted(s0) == sorted(s1) == list(range(0, 400, 10))
    assert s0 != s1 and s0 != list(range(0, 400, 10))


def test_tokens_eval_with_zero_eval_fraction_names_the_key(tmp_path):
    cfg = tokens_cfg(positional(tmp_path, 101), 101, eval_fraction=0.0)
    with pytest.raises(DataError, match=r"^data.eval_fraction: is 0, so there is no eval split$"):
        build_loader(cfg, split="eval", batch_size=1)


# ---- shards.py: writer limits, reader validation ------------------------------------------------
META = {"vocab_size": 13, "eos_id": 0, "tokenizer": "none", "source": "test"}


def small_dataset(tmp_path, name="ds"):
    """Documents [1,2,3] [4..8] [9..12], shards of 5 tokens: 5, 5, 2."""
    from nsa_jax.data.shards import write_dataset

    docs = [np.arange(1, 4), np.arange(4, 9), np.arange(9, 13)]
    write_dataset(tmp_path / name, iter(docs), dtype="uint16", shard_tokens=5, meta=META)
    return tmp_path / name


def test_uint16_holds_id_65535_and_rejects_negative_ids(tmp_path):
    from nsa_jax.data.shards import ShardReader, write_dataset

    write_dataset(tmp_path / "top", iter([np.array([65535, 0, 7])]), dtype="uint16",
                  shard_tokens=8, meta={**META, "vocab_size": 65536})
    assert ShardReader(str(tmp_path / "top")).read(0, 3).tolist() == [65535, 0, 7]
    with pytest.raises(DataError, match=r"token id -1 does not fit uint16"):   # the id at fault
        write_dataset(tmp_path / "neg", iter([np.array([5, -1, 7])]), dtype="uint16",
                      shard_tokens=8, meta=META)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["top"]


def test_write_dataset_refuses_empty_input_existing_out_dir_and_zero_shard_tokens(tmp_path):
    from nsa_jax.data.shards import ShardReader, ShardWriter, write_dataset

    with pytest.raises(DataError, match=r"^test: empty dataset \(no tokens to write\)$"):
        write_dataset(tmp_path / "empty", iter([np.zeros(0, np.int64)]), dtype="uint16",
                      shard_tokens=8, meta=META)
    assert list(tmp_path.iterdir()) == []
    out = small_dataset(tmp_path)
    with pytest.raises(DataError, match=r"^data.out_dir: .*ds already exists"):
        write_dataset(out, iter([np.arange(3)]), dtype="uint16", shard_tokens=8, meta=META)
    assert ShardReader(str(out)).read(0, 12).tolist() == list(range(1, 13))   # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    with pytest.raises(DataError, match=r"^data.shard_tokens: must be >= 1, got 0$"):
        ShardWriter(tmp_path, "uint16", 0)


def test_shard_reader_reads_across_shards_and_from_an_index_json_path(tmp_path):
    from nsa_jax.data.shards import ShardReader

    out = small_dataset(tmp_path)
    r = ShardReader(str(out / "index.json"))
    assert r.total == 12 and r.doc_ends.tolist() == [3, 8, 12]
    assert r.read(3, 7).tolist() == [4, 5, 6, 7, 8, 9, 10]
    assert r.segment_ids(2, 8).tolist() == [0, 1, 1, 1, 1, 1, 2, 2]
    cfg = make_cfg(vocab=13, source="tokens", path=str(out / "index.json"), seq_len=4,
                   eval_fraction=0.0, shuffle=False, packing="documents")
    with build_loader(cfg, batch_size=2) as ld:
        b = next(ld)
    assert b.tokens.tolist() == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
    assert b.segment_ids.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]]


def test_missing_or_inconsistent_shard_files_are_named(tmp_path):
    from nsa_jax.data.shards import ShardReader

    gone = small_dataset(tmp_path, "gone")
    (gone / "shard_00001.bin").unlink()
    with pytest.raises(DataError, match=r"gone/shard_00001.bin: shard listed in index.json is "
                                        r"missing$"):
        ShardReader(str(gone))
    short = small_dataset(tmp_path, "short")
    with open(short / "documents.bin", "r+b") as fh:
        fh.truncate(16)
    with pytest.raises(DataError, match=r"short/documents.bin: corrupt: 16 bytes, expected 3 "
                                        r"int64 document ends = 24 bytes$"):
        ShardReader(str(short))
    off = small_dataset(tmp_path, "off")
    np.array([3, 8, 11], np.int64).tofile(off / "documents.bin")
    with pytest.raises(DataError, match=r"off/documents.bin: corrupt: the last document ends at "
                                        r"11, but the shards hold 12 tokens$"):
        ShardReader(str(off))


# ---- loader.py: state, restore checks, argument checks, errors ----------------------------------
def test_state_before_the_first_batch_is_the_restored_position(tmp_path):
    n = 401
    cfg = tokens_cfg(positional(tmp_path, n), n, prefetch=2)
    with build_loader(cfg, batch_size=3) as full:
        ref = [next(full).tokens for _ in range(3)]
        header = {"source": "tokens", "split": "train", "seq_len": 10, "process_index": 0,
                  "process_count": 1}
    with build_loader(cfg, batch_size=3) as fresh:
        assert fresh.state() == {**header, "cursor": 0}
        next(fresh), next(fresh)
        st = fresh.state()
    assert st == {**header, "cursor": 6}
    with build_loader(cfg, batch_size=3, state=st) as restored:
        assert restored.state() == st                # saved again before any batch: same place
        st2 = restored.state()
    with build_loader(cfg, batch_size=3, state=st2) as again:
        np.testing.assert_array_equal(next(again).tokens, ref[2])


def test_restore_refuses_a_state_of_another_seq_len_or_process_count(tmp_path):
    n = 401
    path = positional(tmp_path, n)
    with build_loader(tokens_cfg(path, n), batch_size=2) as ld:
        next(ld)
        st = ld.state()
    with pytest.raises(DataError, match=r"^data state: saved with seq_len=10, but this loader "
                                        r"has seq_len=20$"):
        build_loader(tokens_cfg(path, n, seq_len=20), batch_size=2, state=st)
    with build_loader(tokens_cfg(path, n), batch_size=2, process_count=2) as ld:
        next(ld)
        st2 = ld.state()
    with pytest.raises(DataError, match=r"^data state: saved with process_count=2, but this "
                                        r"loader has process_count=1$"):
        build_loader(tokens_cfg(path, n), batch_size=2, state=st2)


def test_build_loader_rejects_batch_size_zero_and_an_unknown_split(tmp_path):
    cfg = tokens_cfg(positional(tmp_path, 101), 101, eval_fraction=0.2)
    with pytest.raises(DataError, match=r"^batch_size: must be >= 1, got 0$"):
        build_loader(cfg, batch_size=0)
    with pytest.raises(DataError, match=r"^split: must be one of \['train', 'eval'\], got "
                                        r"'valid'$"):
        build_loader(cfg, split="valid", batch_size=1)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_source_error_is_raised_again_and_the_prefetch_thread_stops(tmp_path, prefetch):
    # documents are tokenized 64 at a time: check() (9 tokens) reads the first 64 only; the
    # first batch (48 rows: 385 tokens > 70 documents of 5) reaches the broken line 71
    path = write_lines(tmp_path / "x.jsonl", [js("aaaa")] * 70 + ["{broken"])
    cfg = make_cfg(source="text", path=str(path), tokenizer="byte", seq_len=8,
                   eval_fraction=0.0, prefetch=prefetch)
    ld = build_loader(cfg, batch_size=48)
    try:
        with pytest.raises(DataError, match=r"x.jsonl:71: invalid JSON") as first:
            next(ld)
        with pytest.raises(DataError) as second:     # not a later batch, not None, no hang
            ld.next(timeout=1) if prefetch else next(ld)
        assert second.value is first.value
        if prefetch:
            ld._thread.join(timeout=2)                 # the worker stops after the error
            assert not ld._thread.is_alive()
    finally:
        ld.close()


# ---- batch.py: the dtypes and shapes the compiled step expects --------------------------------
def test_as_batch_gives_contiguous_int32_and_float32_arrays():
    from nsa_jax.data.batch import Batch, as_batch

    toks = np.arange(24, dtype=np.int64).reshape(3, 8)[:, ::2]       # not contiguous
    b = as_batch(Batch(toks, loss_mask=np.ones((3, 3), bool),
                       segment_ids=np.zeros((3, 4), np.int64)))
    assert b.tokens.dtype == np.int32 and b.tokens.flags.c_contiguous
    assert b.tokens.tolist() == toks.tolist()
    assert b.loss_mask.dtype == np.float32 and b.loss_mask.tolist() == [[1.0] * 3] * 3
    assert b.segment_ids.dtype == np.int32
    bare = as_batch(toks)
    assert bare.tokens.dtype == np.int32 and bare.loss_mask is None and bare.segment_ids is None


def test_batch_fields_match_the_batches_the_loader_yields(tmp_path):
    from nsa_jax.data.batch import batch_fields

    n = 201
    ds = small_dataset(tmp_path)
    retr = config_from_dict({"model": {"vocab_size": 128}, "data": {
        "source": "retrieval", "seq_len": 256, "retrieval": {
            "pairs": 10, "queries": 6, "keys": 32, "values": 16, "loss": "answers"}}})
    cfgs = [tokens_cfg(positional(tmp_path, n), n),
            make_cfg(vocab=13, source="tokens", path=str(ds), seq_len=4, eval_fraction=0.0,
                     packing="documents"),
            retr]
    seen = []
    for cfg in cfgs:
        with build_loader(cfg, batch_size=3) as ld:
            b = next(ld)
        want = batch_fields(cfg.data, 3)
        for got, w in zip(b, want):
            assert (got is None) == (w is None)
            if w is not None:
                assert (got.shape, got.dtype) == (w[0], np.dtype(w[1]))
        seen.append(tuple(None if w is None else w[0] for w in want))
    assert seen == [((3, 11), None, None), ((3, 5), None, (3, 5)),
                    ((3, 257), (3, 256), None)]
