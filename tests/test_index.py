"""Index folders: round trip, manifest checks, atomicity, the embedding cache, model mismatch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retr.indexes.build import IndexConfig, build_index
from retr.indexes.corpus import load_corpus
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.folder import IndexFolder
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError


@pytest.fixture(scope="module")
def encoder(tiny_bi_encoder):
    return BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))


def _cfg(tiny_bi_encoder, kind="flat", bm25=True):
    return IndexConfig(dense=DenseIndexConfig(kind=kind), encoder=EncoderConfig(model=str(tiny_bi_encoder)),
                       bm25=BM25Config() if bm25 else None)


def test_round_trip_manifest_ids_docstore(tiny_dataset, tiny_bi_encoder, encoder, tmp_path):
    corpus = load_corpus(tiny_dataset)
    out = tmp_path / "idx"
    build_index(corpus, out, _cfg(tiny_bi_encoder), encoder=encoder)
    index = IndexFolder(out)
    m = index.manifest
    assert m["num_docs"] == 16 and m["corpus"]["sha256"] == corpus.sha256 and m["corpus"]["empty_docs"] == 1
    d = m["dense"]
    assert d["kind"] == "flat" and d["dim"] == 32 and d["model"]["hash"] == encoder.model_hash
    assert d["bytes"] > 0 and d["build_seconds"] >= 0 and m["bm25"]["bytes"] > 0
    for key in ("faiss-cpu", "torch", "retr", "sentence-transformers"):
        assert m["versions"][key]
    assert m["config"]["dense"]["kind"] == "flat"
    assert index.ids == corpus.ids
    assert index.faiss_index.ntotal == 16
    assert index.docstore.get(5) == corpus.docs[5]
    assert index.docstore.get(14).text == ""
    # the stored vectors are the normalised embeddings of title + text
    v = index.faiss_index.reconstruct(0)
    expected = encoder.encode([corpus.docs[0].full_text()])[0]
    np.testing.assert_allclose(v, expected, atol=1e-5)
    assert not list(tmp_path.glob(".idx*")), "no temporary folders left behind"


def test_failed_build_leaves_no_folder_and_keeps_old_one(tiny_dataset, tiny_bi_encoder, encoder, tmp_path,
                                                         monkeypatch):
    corpus = load_corpus(tiny_dataset)
    work = tmp_path / "work"
    out = work / "idx"

    def boom(*a, **k):
        raise RuntimeError("disk full")

    import retr.indexes.build as build_mod

    monkeypatch.setattr(build_mod, "build_faiss", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build_index(corpus, out, _cfg(tiny_bi_encoder), encoder=encoder)
    assert not out.exists() and not list(work.iterdir())
    monkeypatch.undo()
    build_index(corpus, out, _cfg(tiny_bi_encoder, bm25=False), encoder=encoder)
    before = (out / "manifest.json").read_text()
    monkeypatch.setattr(build_mod, "build_bm25", boom)
    with pytest.raises(RuntimeError):
        build_index(corpus, out, _cfg(tiny_bi_encoder, bm25=True), encoder=encoder)
    assert (out / "manifest.json").read_text() == before
    assert IndexFolder(out).faiss_index.ntotal == 16
    assert sorted(p.name for p in work.iterdir()) == ["idx"]


def test_embedding_cache_skips_encoding(tiny_dataset, tiny_bi_encoder, encoder, tmp_path, monkeypatch, caplog):
    corpus = load_corpus(tiny_dataset)
    calls = []
    real = encoder.encode_corpus  # what a local index build encodes its documents with
    monkeypatch.setattr(encoder, "encode_corpus", lambda texts, **k: calls.append(len(texts)) or real(texts, **k))
    counted = []
    real_truncation = encoder.tokens.truncation  # a second tokenisation, only to count: not needed by either build
    monkeypatch.setattr(encoder.tokens, "truncation", lambda texts: counted.append(len(texts)) or real_truncation(texts))
    first = build_index(corpus, tmp_path / "a", _cfg(tiny_bi_encoder), encoder=encoder)
    assert calls == [16] and counted == [], "the encoding's own tokenisation measures the truncation"
    caplog.set_level("INFO", logger="retr")  # whatever level an earlier test left on retr's logger
    m = build_index(corpus, tmp_path / "b", _cfg(tiny_bi_encoder, kind="hnsw"), encoder=encoder)
    assert calls == [16], "second build must not re-encode"
    assert counted == [], "second build must not tokenise the corpus again"
    assert m["dense"]["truncation"] == first["dense"]["truncation"] and m["dense"]["truncation"]["texts"] == 16
    assert first["dense"]["truncation"] == real_truncation([d.full_text() for d in corpus.docs])
    assert m["dense"]["encode"]["cached"] is True and "embedding cache used" in caplog.text
    a, b = IndexFolder(tmp_path / "a").faiss_index, IndexFolder(tmp_path / "b").faiss_index
    np.testing.assert_array_equal(a.reconstruct_n(0, 16), b.reconstruct_n(0, 16))


def test_corrupt_or_foreign_folders_are_refused(tiny_dataset, tiny_bi_encoder, encoder, tmp_path):
    with pytest.raises(RetrError, match="no such index folder"):
        IndexFolder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RetrError, match=r"manifest\.json: missing"):
        IndexFolder(tmp_path / "empty")
    out = tmp_path / "idx"
    build_index(load_corpus(tiny_dataset), out, _cfg(tiny_bi_encoder), encoder=encoder)
    m = json.loads((out / "manifest.json").read_text())
    m["num_docs"] = 99
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RetrError, match="id list has 16 entries, manifest says 99"):
        IndexFolder(out)
    m["num_docs"] = 16
    m["format_version"] = 999
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RetrError, match="format version 999"):
        IndexFolder(out)


def test_index_refuses_query_encoder_of_another_model(tiny_dataset, tiny_bi_encoder, encoder, tmp_path, monkeypatch):
    from retr.retrieval.compose import encoder_for_index
    from retr.retrieval.encoder import EncoderConfig

    out = tmp_path / "idx"
    build_index(load_corpus(tiny_dataset), out, _cfg(tiny_bi_encoder), encoder=encoder)
    index = IndexFolder(out)
    assert encoder_for_index(index).model_hash == encoder.model_hash  # default: the model that built it
    onnx_dir = tmp_path / "retr-cache" / "onnx"
    before = sorted(p.name for p in onnx_dir.iterdir()) if onnx_dir.is_dir() else []
    with pytest.raises(RetrError, match=r"built with model .* search without --model"):
        encoder_for_index(index, EncoderConfig(model=None or "minilm"))  # the bundled model: another identity
    after = sorted(p.name for p in onnx_dir.iterdir()) if onnx_dir.is_dir() else []
    assert after == before, "no graph is exported for a model the index refuses"
