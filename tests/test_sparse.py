"""The learned sparse stage: tiny random SparseEncoders (SPLADE over an MLM head, CSR over a dense model) built
here; the encoder against sentence-transformers, exact search against numpy, the index part (round trip,
checksums, add/delete), three-way fusion, seismic against exact, and the refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from retr.retrieval.errors import RetrError

from .conftest import DOCS, QUERIES, _tiny_bert_config, _tokenizer, write_beir


@pytest.fixture(scope="session")
def tiny_splade(tmp_path_factory):
    """A random 2-layer BERT with an MLM head and SPLADE max pooling, saved as a SparseEncoder folder."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-splade")
    bert = root / "bert"
    tok = _tokenizer(bert)
    BertForMaskedLM(_tiny_bert_config(tok.vocab_size)).save_pretrained(bert)
    tok.save_pretrained(bert)
    model = SparseEncoder(modules=[Transformer(str(bert), transformer_task="fill-mask", max_seq_length=64),
                                   SpladePooling("max")], device="cpu")
    out = root / "splade"
    model.save(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_csr(tmp_path_factory, tiny_bi_encoder):
    """The tiny bi-encoder with a sparse auto-encoder on top (CSR), saved as a SparseEncoder folder."""
    import torch
    from sentence_transformers import SentenceTransformer, SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    torch.manual_seed(0)
    dense = SentenceTransformer(str(tiny_bi_encoder), device="cpu")
    model = SparseEncoder(modules=[*dense, SparseAutoEncoder(32, 128, k=8, k_aux=16)], device="cpu")
    out = tmp_path_factory.mktemp("tiny-csr") / "csr"
    model.save(str(out))
    return out


def _encoder(path, **kw):
    from retr.retrieval.sparse import SparseConfig, SparseEncoderModel

    return SparseEncoderModel(SparseConfig(str(path), **kw))


TEXTS = [f"{t} {x}".strip() for _, t, x in DOCS]


@pytest.mark.parametrize("which,kind", [("tiny_splade", "splade"), ("tiny_csr", "csr")])
def test_encoder_rows_are_sentence_transformers_vectors(which, kind, request):
    from sentence_transformers import SparseEncoder

    path = request.getfixturevalue(which)
    enc = _encoder(path)
    assert enc.kind == kind
    rows = enc.encode_documents(TEXTS)
    want = SparseEncoder(str(path), device="cpu").encode_document(TEXTS, convert_to_sparse_tensor=False)
    assert rows.shape == tuple(want.shape)
    np.testing.assert_allclose(rows.toarray(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert rows.nnz > 0 and rows.nnz < rows.shape[0] * rows.shape[1]  # sparse, and not empty
    assert enc.describe()["hash"] == enc.ref.hash


def test_dense_model_given_as_sparse_is_refused_in_one_line(tiny_bi_encoder):
    with pytest.raises(RetrError) as e:
        _encoder(tiny_bi_encoder)
    assert "not a sparse encoder" in str(e.value) and str(tiny_bi_encoder) in str(e.value)
    assert "\n" not in str(e.value)


def test_hub_id_missing_offline_names_cache_and_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RetrError) as e:
        _encoder("retr-test/absent-splade")
    msg = str(e.value)
    assert "'retr-test/absent-splade'" in msg and "hub cache" in msg and "\n" not in msg
    from huggingface_hub import constants

    assert str(constants.HF_HUB_CACHE) in msg


def _reference(enc, queries, docs_matrix, k):
    """Brute force in numpy: dense query vectors against dense document vectors."""
    q = enc.encode_queries(queries).toarray().astype(np.float64)
    d = docs_matrix.toarray().astype(np.float64)
    return q @ d.T


def test_exact_search_matches_numpy(tiny_splade):
    from retr.retrieval.sparse import SparseRetriever

    enc = _encoder(tiny_splade)
    ids = [d for d, _, _ in DOCS]
    matrix = enc.encode_documents(TEXTS)
    retriever = SparseRetriever(matrix, ids, enc)
    run = retriever.search(QUERIES, 5)
    scores = _reference(enc, list(QUERIES.values()), matrix, 5)
    for i, qid in enumerate(QUERIES):
        order = sorted(range(len(ids)), key=lambda j: (-scores[i, j], ids[j]))
        want = [ids[j] for j in order if scores[i, j] > 0][:5]
        got = [h.doc_id for h in run[qid]]
        assert got == want, qid
        np.testing.assert_allclose([h.score for h in run[qid]], sorted(scores[i][scores[i] > 0], reverse=True)[:5],
                                   rtol=1e-5)
    allowed = np.array([1, 4, 7], dtype=np.int64)  # a filter: only these positions come back
    filtered = retriever.restricted(allowed).search(QUERIES, 5)
    assert all(h.doc_id in {ids[p] for p in allowed} for hits in filtered.values() for h in hits)


def test_seismic_agrees_with_exact_on_a_small_corpus(tiny_splade):
    pytest.importorskip("seismic")
    from retr.retrieval.sparse import SparseRetriever

    enc = _encoder(tiny_splade, engine="seismic", query_cut=1000, heap_factor=1.0)
    ids = [d for d, _, _ in DOCS]
    matrix = enc.encode_documents(TEXTS)
    exact = SparseRetriever(matrix, ids, enc, engine="exact").search(QUERIES, 3)
    approx = SparseRetriever(matrix, ids, enc).search(QUERIES, 3)
    for qid in QUERIES:  # every query dimension kept, no pruning: the same top 3
        assert [h.doc_id for h in approx[qid]] == [h.doc_id for h in exact[qid]]
        np.testing.assert_allclose([h.score for h in approx[qid]], [h.score for h in exact[qid]], rtol=1e-4)


@pytest.fixture
def sparse_index(tmp_path, tiny_dataset, tiny_bi_encoder, tiny_splade):
    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.sparse import SparseConfig

    out = tmp_path / "idx"
    cfg = IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder)), bm25=BM25Config(),
                      sparse=SparseConfig(str(tiny_splade)), use_cache=False)
    build_index(load_corpus(tiny_dataset / "corpus.jsonl"), out, cfg)
    return out


def test_index_round_trip(sparse_index, tiny_splade):
    from retr.indexes.folder import IndexFolder

    index = IndexFolder(sparse_index)
    try:
        info = index.manifest.sparse
        assert info.dir == "sparse" and info.model["kind"] == "splade" and info.bytes > 0
        assert all(f"sparse/{n}" in index.manifest.files for n in ("data.npy", "indices.npy", "indptr.npy"))
        want = _encoder(tiny_splade).encode_documents([index.docstore.get(r).full_text() for r in range(16)])
        got = index.sparse_matrix
        assert got.shape == want.shape and info.nnz == got.nnz
        np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-6)
    finally:
        index.close()


def test_a_tampered_sparse_part_is_refused(sparse_index):
    from retr.indexes.folder import IndexFolder

    data = sparse_index / "sparse" / "data.npy"
    arr = np.load(data)
    arr[0] += 1.0
    np.save(data, arr)
    with pytest.raises(RetrError, match="sparse/data.npy"):
        IndexFolder(sparse_index)


def test_an_unrecorded_file_in_the_sparse_part_is_refused(sparse_index):
    from retr.indexes.folder import IndexFolder

    (sparse_index / "sparse" / "extra.npy").write_bytes(b"x")
    with pytest.raises(RetrError, match="not a part its manifest records"):
        IndexFolder(sparse_index)


def _search(folder, mode, k=5, engine="exact"):
    from retr.indexes.folder import IndexFolder
    from retr.retrieval.compose import IndexParts, build
    from retr.retrieval.pipeline import PipelineConfig, parse

    index = IndexFolder(folder)
    try:
        return build(parse(mode), IndexParts(index), PipelineConfig(sparse_engine=engine)).search(QUERIES, k)
    finally:
        index.close()


def test_add_and_delete_equal_a_fresh_build(tmp_path, sparse_index, tiny_bi_encoder, tiny_splade):
    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import load_corpus
    from retr.indexes.update import add_documents, delete_documents
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.sparse import SparseConfig


    delete_documents(sparse_index, ["d2", "d7"])
    extra = [("d17", "Geysers", "Geysers erupt hot water and steam from the earth."),
             ("d1", "Solar power", "Solar cells turn sunlight into electricity on roofs.")]  # d1: an update
    add_documents(sparse_index, load_corpus(write_beir(tmp_path / "more", extra) / "corpus.jsonl"))
    live = [d for d in DOCS if d[0] not in ("d1", "d2", "d7")] + extra
    fresh = tmp_path / "fresh"
    build_index(load_corpus(write_beir(tmp_path / "all", live) / "corpus.jsonl"), fresh,
                IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder)), bm25=BM25Config(),
                            sparse=SparseConfig(str(tiny_splade)), use_cache=False))
    changed, want = _search(sparse_index, "splade"), _search(fresh, "splade")
    for qid in QUERIES:
        assert [h.doc_id for h in changed[qid]] == [h.doc_id for h in want[qid]]
        np.testing.assert_allclose([h.score for h in changed[qid]], [h.score for h in want[qid]], rtol=1e-5)
    assert not any(h.doc_id in ("d2", "d7") for hits in changed.values() for h in hits)


def test_three_way_fusion_fuses_the_three_runs(sparse_index):
    from retr.retrieval.fusion import minmax
    from retr.retrieval.pipeline import PipelineConfig, parse

    depth = PipelineConfig().fusion_depth
    parts = [_search(sparse_index, m, depth) for m in ("bm25", "dense", "splade")]
    want = minmax(parts, 5, None, depth)
    got = _search(sparse_index, "hybrid3")
    assert str(parse("fuse(bm25,dense,splade)")) == "hybrid3"
    from retr.stages import BM25, Dense, Fuse, Splade

    assert Fuse(BM25(), Dense(), Splade()) == parse("hybrid3")
    for qid in QUERIES:
        assert [(h.doc_id, round(h.score, 9)) for h in got[qid]] == [(h.doc_id, round(h.score, 9)) for h in want[qid]]
    assert "sparse" in parse("hybrid3").needs and "sparse" not in parse("hybrid").needs
    seismic = _search(sparse_index, "fuse(splade,bm25)", engine="seismic")  # a composition the registry allows
    assert all(seismic[q] for q in QUERIES if _search(sparse_index, "bm25")[q])
    two = _search(sparse_index, "hybrid")
    assert any([h.doc_id for h in two[q]] != [h.doc_id for h in got[q]] for q in QUERIES)  # the third list counts


def test_an_index_without_a_sparse_part_says_how_to_build_one(tmp_path, tiny_dataset, tiny_bi_encoder):
    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig

    out = tmp_path / "plain"
    build_index(load_corpus(tiny_dataset / "corpus.jsonl"), out,
                IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder)), bm25=BM25Config(), use_cache=False))
    with pytest.raises(RetrError, match="--sparse-model"):
        _search(out, "splade")


def test_a_changed_sparse_model_is_refused(tmp_path, sparse_index, tiny_splade):
    moved = tmp_path / "splade-copy"
    shutil.copytree(tiny_splade, moved)
    manifest = json.loads((sparse_index / "manifest.json").read_text())
    assert manifest["sparse"]["model"]["path"] == str(tiny_splade)
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(moved / "model.safetensors"))
    key = next(iter(weights))
    weights[key] = weights[key] + 1
    save_file(weights, str(moved / "model.safetensors"))
    from retr.retrieval.sparse import sparse_encoder_for

    with pytest.raises(RetrError, match="rebuild the index"):
        sparse_encoder_for(sparse_index, {**manifest["sparse"]["model"], "path": str(moved)})


def test_cli_eval_three_way(tmp_path, tiny_dataset, tiny_bi_encoder, tiny_splade, capsys):
    from retr.cli.main import main

    out = tmp_path / "report.json"
    rc = main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25,dense,splade,hybrid,hybrid3",
               "--model", str(tiny_bi_encoder), "--sparse-model", str(tiny_splade), "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["pipelines"]) == ["bm25", "dense", "splade", "hybrid", "hybrid3"]
    splade, three = report["pipelines"]["splade"], report["pipelines"]["hybrid3"]
    assert splade["index_bytes"] == report["index"]["manifest"]["sparse"]["bytes"] > 0
    assert "splade" in splade["latency_ms"] and "splade" in three["latency_ms"] and "bm25" in three["latency_ms"]
    assert three["index_bytes"] == sum(report["pipelines"][m]["index_bytes"] for m in ("bm25", "dense", "splade"))


def test_api_and_service_search_the_sparse_part_as_the_pipeline_does(tmp_path, tiny_dataset, tiny_bi_encoder,
                                                                      tiny_splade):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import retr
    from retr.serve.config import ServeConfig

    from .serving import Server

    out = tmp_path / "api-idx"
    with retr.Index.build(tiny_dataset, out, model=str(tiny_bi_encoder), use_cache=False,
                          sparse_model=str(tiny_splade)) as index:
        assert index.manifest.sparse.model["kind"] == "splade"
        found = {m: index.search(QUERIES["q4"], k=4, mode=m) for m in ("splade", "hybrid3")}
    want = {m: _search(out, m, 4)["q4"] for m in ("splade", "hybrid3")}
    for m in found:
        assert [h.id for h in found[m].hits] == [h.doc_id for h in want[m]] and found[m].hits
        assert "splade" in found[m].latency_ms
    server = Server(out, ServeConfig())
    try:
        status, body = server.request("/search", {"query": QUERIES["q4"], "k": 4, "mode": "hybrid3"})
    finally:
        server.stop()
    assert status == 200 and [r["id"] for r in body["results"]] == [h.doc_id for h in want["hybrid3"]]


@pytest.mark.parametrize("kind,base", [("csr", "st"), ("splade", "bert")])
def test_train_sparse_encoder_writes_a_folder_the_index_takes(kind, base, tiny_train, tiny_bi_encoder, tmp_path):
    """`retr train sparse-encoder` on the tiny train split: a SparseEncoder folder of the kind asked for, whose loss
    fell, with its manifest; the splade stage then indexes with it."""
    from retr.eval.data import load_dataset
    from retr.train.sparse_encoder import SparseEncoderTrainConfig, train_sparse_encoder

    ds = load_dataset(str(tiny_train), "train", download=False)
    out = tmp_path / kind
    cfg = SparseEncoderTrainConfig(base=str(tiny_bi_encoder.parent / base), kind=kind, epochs=3, batch_size=4,
                                   learning_rate=1e-3, max_length=32, negative_depth=5, dev_fraction=0.3,
                                   dev_candidates=5, active_dims=8, freeze_layers=0, seed=0)
    m = train_sparse_encoder(out, cfg, dataset=ds)
    assert len(m["loss_history"]) >= 2 and m["loss_history"][-1] < m["loss_history"][0]
    assert len(m["dev_ndcg@10_per_epoch"]) == 3
    manifest = json.loads((out / "retr_manifest.json").read_text())
    assert manifest["format"] == "retr-sparse-encoder" and manifest["sparse_kind"] == kind
    enc = _encoder(out)
    assert enc.kind == kind
    rows = enc.encode_documents(TEXTS[:3])
    assert rows.shape[0] == 3 and rows.nnz > 0
    if kind == "csr":
        assert (np.diff(rows.indptr) <= 8).all()  # at most active_dims non-zero a text
    assert not (tmp_path / f".{kind}.checkpoints").exists()
