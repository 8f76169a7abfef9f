"""A modern backbone end to end: a tiny random ModernBERT goes through MLM (its own 30% recipe), contrastive
training, export with the agreement check, indexing, search and a cross-encoder, as BERT does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retr.eval.data import load_dataset
from retr.indexes.corpus import load_corpus
from retr.indexes.searcher import Searcher
from retr.retrieval.encoder import BiEncoder, EncoderConfig


@pytest.fixture(scope="module")
def trained(tiny_modernbert, tiny_train, tmp_path_factory):
    from retr.train.bi_encoder import BiEncoderTrainConfig, train_bi_encoder
    from retr.train.mlm import MLMTrainConfig, train_mlm

    root = tmp_path_factory.mktemp("mb-models")
    mlm = train_mlm(root / "mlm", MLMTrainConfig(base=str(tiny_modernbert), epochs=3, batch_size=4, learning_rate=5e-3,
                                                 max_length=32, dev_fraction=0.2), load_corpus(tiny_train))
    cfg = BiEncoderTrainConfig(base=str(root / "mlm"), epochs=2, batch_size=4, mini_batch_size=2, learning_rate=1e-3,
                               max_length=32, num_negatives=1, negative_depth=5, dev_fraction=0.3, dev_candidates=5,
                               seed=0)
    bi = train_bi_encoder(root / "bi", cfg, dataset=load_dataset(str(tiny_train), "train", download=False))
    return root, mlm, bi


def test_mlm_follows_modernberts_recipe(trained):
    root, mlm, _ = trained
    assert mlm["recipe"] == {"architecture": "modernbert", "mask_prob": 0.3, "mask": 0.8, "random": 0.1, "keep": 0.1,
                             "replace": "80/10/10"}
    assert mlm["loss_history"][-1] < mlm["loss_history"][0]
    config = json.loads((root / "mlm" / "config.json").read_text())
    assert config["model_type"] == "modernbert"


def test_bi_encoder_exports_checked_indexes_and_searches(trained, tiny_train, tmp_path, capsys):
    from retr.cli.main import main

    root, _, bi = trained
    assert json.loads((root / "bi" / "config.json").read_text())["model_type"] == "modernbert"
    for backend in ("onnx", "openvino-int8"):
        out = tmp_path / backend
        assert main(["index", "--corpus", str(tiny_train), "--out", str(out), "--model", str(root / "bi"),
                     "--backend", backend]) == 0
        m = json.loads((out / "manifest.json").read_text())
        model = m["dense"]["model"]
        assert model["architecture"] == "modernbert"
        graph = m["dense"]["encode"]["graph"]
        assert graph["backend"] != "torch" and graph["check_cosine"] >= 0.99, graph
        s = Searcher(out, EncoderConfig(backend=backend))
        hits = s.search("how do solar panels make electricity", k=5, mode="hybrid").hits
        assert len(hits) == 5
        torch_vec = BiEncoder(EncoderConfig(model=str(root / "bi"), backend="torch")).encode_queries(["wolves"])
        np.testing.assert_allclose(s.encoder.encode_queries(["wolves"]) @ torch_vec.T, [[1.0]], atol=0.02)
        s.close()


def test_cross_encoder_from_modernbert(trained, tiny_train, tiny_modernbert, tmp_path):
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
    from retr.train.cross_encoder import CrossEncoderTrainConfig, train_cross_encoder

    root, _, _ = trained
    cfg = CrossEncoderTrainConfig(base=str(tiny_modernbert), first_stage_model=str(root / "bi"), epochs=1,
                                  batch_size=4, learning_rate=1e-3, max_length=32, num_negatives=2, negative_depth=8,
                                  dev_fraction=0.3, dev_depth=6, seed=0)
    m = train_cross_encoder(tmp_path / "ce", cfg, load_dataset(str(tiny_train), "train", download=False))
    assert m["loss_history"]
    for backend in ("torch", "onnx"):
        reranker = CrossEncoderReranker(RerankConfig(model=str(tmp_path / "ce"), max_length=32, backend=backend))
        scores = reranker.score("solar panels", ["Solar panels convert sunlight", "Tea leaves"])
        assert scores.shape == (2,)
        if backend == "torch":
            ref = scores
    np.testing.assert_allclose(scores, ref, atol=1e-3)
