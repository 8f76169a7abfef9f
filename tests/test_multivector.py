"""The late-interaction stage (``+maxsim``): a tiny random MultiVectorEncoder built here; MaxSim against
sentence-transformers' own scoring, the token-vector cache (reuse, damage, another id list), the rerank contract
(only the head moves), the refusals, and the CLI's eval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retr.retrieval.errors import RetrError

from .conftest import QUERIES


@pytest.fixture(scope="session")
def tiny_multivector(tmp_path_factory, tiny_bi_encoder):
    """The tiny bi-encoder's BERT with a random 16-dimensional token projection, saved as a MultiVectorEncoder."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    word = Transformer(str(tiny_bi_encoder), max_seq_length=64)
    proj = Dense(32, 16, bias=False, activation_function=torch.nn.Identity(),
                 module_input_name="token_embeddings", module_output_name="token_embeddings")
    model = MultiVectorEncoder(modules=[word, proj, MultiVectorMask(), Normalize(module_input_name="token_embeddings",
                                                                                  module_output_name="token_embeddings")],
                               device="cpu")
    out = tmp_path_factory.mktemp("tiny-mv") / "mv"
    model.save(str(out))
    return out


@pytest.fixture
def plain_index(tmp_path, tiny_dataset, tiny_bi_encoder):
    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig

    out = tmp_path / "idx"
    build_index(load_corpus(tiny_dataset / "corpus.jsonl"), out,
                IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder)), bm25=BM25Config(), use_cache=False))
    return out


def _search(folder, mode, model, k=5):
    from retr.indexes.folder import IndexFolder
    from retr.retrieval.compose import IndexParts, build
    from retr.retrieval.pipeline import PipelineConfig, parse

    index = IndexFolder(folder)
    try:
        cfg = PipelineConfig(multivector_model=None if model is None else str(model))
        return build(parse(mode), IndexParts(index), cfg).search(QUERIES, k)
    finally:
        index.close()


def test_maxsim_reranks_the_head_by_sentence_transformers_scores(plain_index, tiny_multivector):
    from sentence_transformers import MultiVectorEncoder

    from retr.indexes.folder import IndexFolder

    first = _search(plain_index, "bm25", None, 10)
    got = _search(plain_index, "bm25+maxsim(depth=4)", tiny_multivector, 10)
    st = MultiVectorEncoder(str(tiny_multivector), device="cpu")
    index = IndexFolder(plain_index)
    texts = {d: index.docstore.get(i).full_text() for i, d in enumerate(index.ids)}
    index.close()
    for qid, query in QUERIES.items():
        head, tail = [h.doc_id for h in first[qid][:4]], [h.doc_id for h in first[qid][4:]]
        if not head:
            continue
        q = st.encode_query([query])
        d = st.encode_document([texts[x] for x in head])
        want = st.similarity(q, d)[0].numpy()
        order = [head[i] for i in np.argsort(-want, kind="stable")]
        assert [h.doc_id for h in got[qid]] == order + tail, qid  # the head reordered, the tail kept as it was
        np.testing.assert_allclose([h.score for h in got[qid][:len(head)]], np.sort(want)[::-1], rtol=2e-3, atol=2e-3)


def test_token_vectors_are_kept_reused_and_rebuilt_when_damaged(plain_index, tiny_multivector, caplog):
    from retr.retrieval.artifacts import cache_home

    first = _search(plain_index, "hybrid+maxsim", tiny_multivector)
    (entry,) = (cache_home() / "multivector").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    vectors = np.load(entry / "vectors.npy")
    assert vectors.dtype == np.float16 and vectors.shape[1] == 16 == meta["dim"]
    offsets = np.load(entry / "offsets.npy")
    assert offsets[0] == 0 and offsets[-1] == len(vectors) and np.all(np.diff(offsets) > 0)
    stamp = (entry / "vectors.npy").stat().st_mtime_ns
    assert _search(plain_index, "hybrid+maxsim", tiny_multivector) == first
    assert (entry / "vectors.npy").stat().st_mtime_ns == stamp  # read back, not encoded again
    with (entry / "vectors.npy").open("r+b") as fh:  # one flipped byte in the vectors
        fh.seek(-3, 2)
        fh.write(b"\x7f")
    with caplog.at_level("WARNING", logger="retr"):
        again = _search(plain_index, "hybrid+maxsim", tiny_multivector)
    assert "damaged" in caplog.text and again == first


def test_weight_zero_keeps_the_first_stage_order(plain_index, tiny_multivector):
    first = _search(plain_index, "hybrid", None)
    kept = _search(plain_index, "hybrid+maxsim(weight=0)", tiny_multivector)
    assert {q: [h.doc_id for h in hits] for q, hits in kept.items()} == \
        {q: [h.doc_id for h in hits] for q, hits in first.items()}


def test_refusals_are_one_line(plain_index, tiny_bi_encoder):
    with pytest.raises(RetrError, match="--multivector-model") as e:
        _search(plain_index, "hybrid+maxsim", None)
    assert "\n" not in str(e.value)
    with pytest.raises(RetrError, match="not a multi-vector encoder") as e:
        _search(plain_index, "hybrid+maxsim", tiny_bi_encoder)
    assert str(tiny_bi_encoder) in str(e.value) and "\n" not in str(e.value)


def test_cli_eval_reports_the_maxsim_stage(tmp_path, tiny_dataset, tiny_bi_encoder, tiny_multivector):
    from retr.cli.main import main

    out = tmp_path / "report.json"
    rc = main(["eval", "--dataset", str(tiny_dataset), "--mode", "hybrid,hybrid+maxsim", "--model",
               str(tiny_bi_encoder), "--multivector-model", str(tiny_multivector), "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["pipelines"]) == ["hybrid", "hybrid+maxsim"]
    assert "maxsim" in report["pipelines"]["hybrid+maxsim"]["latency_ms"]


def test_train_multi_vector_writes_a_folder_the_maxsim_stage_takes(tiny_train, tiny_bi_encoder, plain_index, tmp_path):
    """`retr train multi-vector` on the tiny train split: a MultiVectorEncoder folder whose loss fell, with its
    manifest and the token dimension asked for; the maxsim stage then reranks with it."""
    from retr.eval.data import load_dataset
    from retr.retrieval.multivector import MultiVectorModel
    from retr.train.multi_vector import MultiVectorTrainConfig, train_multi_vector

    out = tmp_path / "mv"
    cfg = MultiVectorTrainConfig(base=str(tiny_bi_encoder), epochs=3, batch_size=4, learning_rate=1e-3,
                                 max_length=32, dim=8, negative_depth=5, dev_fraction=0.3, dev_candidates=5, seed=0)
    m = train_multi_vector(out, cfg, dataset=load_dataset(str(tiny_train), "train", download=False))
    assert len(m["loss_history"]) >= 2 and m["loss_history"][-1] < m["loss_history"][0]
    assert json.loads((out / "retr_manifest.json").read_text())["format"] == "retr-multi-vector"
    vectors, offsets = MultiVectorModel(str(out)).encode_documents(["solar power", "rivers flow to the sea"])
    assert vectors.shape[1] == 8 and len(offsets) == 3
    run = _search(plain_index, "bm25+maxsim", out)
    assert any(run.values())
