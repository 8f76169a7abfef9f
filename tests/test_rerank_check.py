"""The reranker check: a cross-encoder on a corpus it was not trained on is measured on pseudo-queries cut from
that corpus, and its weight there is capped by what they choose (retr.eval.pseudo, CrossEncoderReranker.weight_for)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from retr.eval.pseudo import cut_queries
from retr.retrieval.rerank import (
    CHECK_SEED,
    PSEUDO_QUERIES,
    WEIGHT_RULE,
    CorpusCheck,
    CrossEncoderReranker,
    RerankConfig,
    RerankRetriever,
    checked_weight,
)
from retr.retrieval.types import Document, Hit, Run

from .conftest import DOCS, write_beir

OTHER = "0" * 64  # the checksum of a corpus the test reranker claims it was trained on


def _trained_reranker(tiny_cross_encoder: Path, where: Path, weight: float = 0.5, corpus: str = OTHER) -> Path:
    """The tiny cross-encoder as `retr train cross-encoder` leaves one: its weight and training corpus recorded."""
    out = where / "ce"
    shutil.copytree(tiny_cross_encoder, out)
    (out / "retr_manifest.json").write_text(json.dumps({"interpolation": weight, "corpus_sha256": corpus}))
    return out


def _long_docs(n: int = 40) -> list[tuple[str, str, str]]:
    """``n`` documents of 25-35 words made from the fixture's sentences (the tiny models' vocabulary)."""
    texts = [t for _, _, t in DOCS if t]
    return [(f"L{i}", "", " ".join(texts[(i * k) % len(texts)] for k in (1, 3, 7))) for i in range(n)]


def _check(curve_weight: float, corpus: str, model: str | None, reranker) -> CorpusCheck:
    # a plateau of two weights from ``curve_weight``: the rule picks its start (below 0.9)
    curve = {f"{w / 10:.1f}": float(0 <= w / 10 - curve_weight < 0.15) for w in range(11)}
    return CorpusCheck(corpus_sha256=corpus, reranker_hash=reranker.model_hash, first_stage="hybrid",
                       first_stage_model=model or "", depth=reranker.config.depth, max_length=reranker.max_length,
                       queries=50, seed=7, weight=curve_weight, curve=curve, first_stage_ndcg=0.5, seconds=1.0)


def test_pseudo_queries_are_spans_cut_out_of_long_enough_documents():
    docs = [Document(f"d{i}", "", " ".join(f"w{i}_{j}" for j in range(10 + 3 * i))) for i in range(12)]
    cut = cut_queries(docs, 5, seed=3)
    assert cut == cut_queries(docs, 5, seed=3) and cut != cut_queries(docs, 5, seed=4)  # seeded
    assert len(cut) == 5 and len({c.position for c in cut}) == 5  # one per document
    for c in cut:
        words, query = docs[c.position].text.split(), c.query.split()
        assert 6 <= len(query) <= 14 and len(words) >= 2 * len(query)
        start = words.index(query[0])
        assert words[start:start + len(query)] == query  # a contiguous span of the document
        assert c.rest.split() == words[:start] + words[start + len(query):]  # and the rest is the document without it
    assert cut_queries(docs[:1], 5, seed=3) == []  # 10 words hold no span of 6+ twice


def test_weight_policy_on_the_trained_corpus_another_one_and_a_given_weight(tiny_cross_encoder, tmp_path, caplog):
    path = _trained_reranker(tiny_cross_encoder, tmp_path)
    rr = CrossEncoderReranker(RerankConfig(model=str(path), max_length=32))
    mine = rr.weight_for(OTHER, "m")  # the corpus it was trained on: the weight chosen on its dev queries
    assert (mine.weight, mine.source) == (0.5, "trained") and not rr.needs_check(OTHER)
    assert rr.needs_check("1" * 64)
    with caplog.at_level("WARNING", logger="retr.retrieval.rerank_model"):
        assert rr.weight_for("1" * 64, "m") == rr.weight_for("1" * 64, "m")  # unchecked: kept, one warning
    warned = [r.getMessage() for r in caplog.records if "has not been checked" in r.getMessage()]
    assert len(warned) == 1 and rr.weight_for("1" * 64, "m").source == "unchecked"
    rr.adopt(_check(0.2, "1" * 64, "m", rr))
    assert (rr.weight_for("1" * 64, "m").weight, rr.weight_for("1" * 64, "m").source) == (0.2, "checked")
    assert rr.weight_for("1" * 64, "other-model").source == "unchecked"  # a check is per first-stage model
    rr.adopt(_check(0.9, "2" * 64, "m", rr))
    assert rr.weight_for("2" * 64, "m").weight == 0.5  # a check only ever lowers the trained weight
    given = CrossEncoderReranker(RerankConfig(model=str(path), max_length=32, interpolation=0.7))
    assert (given.weight_for("1" * 64, "m").weight, given.weight_for("1" * 64, "m").source) == (0.7, "given")
    assert not given.needs_check("1" * 64)
    off = CrossEncoderReranker(RerankConfig(model=str(path), max_length=32, corpus_check=False))
    off.adopt(_check(0.2, "1" * 64, "m", off))
    assert not off.needs_check("1" * 64) and off.weight_for("1" * 64, "m").source == "unchecked"
    plain = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), max_length=32))  # not trained by retr
    assert plain.weight_for("1" * 64, "m").source == "trained" and not plain.needs_check("1" * 64)


def test_a_stored_check_is_found_by_another_process_and_a_damaged_one_is_measured_again(tiny_cross_encoder, tmp_path):
    path = _trained_reranker(tiny_cross_encoder, tmp_path)
    rr = CrossEncoderReranker(RerankConfig(model=str(path), max_length=32))
    key = rr.check_key("3" * 64, "m")
    stored = _check(0.1, "3" * 64, "m", rr).save(key)
    fresh = CrossEncoderReranker(RerankConfig(model=str(path), max_length=32))
    assert fresh.weight_for("3" * 64, "m").weight == 0.1
    # a check stored under an earlier rule: its weight is re-chosen from its curve. CISI's pseudo-queries for the
    # default SciFact cross-encoder: neighbour averages alone picked 0.1, which lost to the first stage there
    cisi = [0.3245, 0.3203, 0.3229, 0.3169, 0.3115, 0.2986, 0.2873, 0.2673, 0.2467, 0.2203, 0.2028]
    earlier = json.loads(stored.read_text()) | {"weight": 0.1,
                                                "curve": {f"{i / 10:.1f}": v for i, v in enumerate(cisi)}}
    stored.write_text(json.dumps(earlier))
    assert CorpusCheck.load(key).weight == 0.0 and json.loads(stored.read_text())["weight"] == 0.1
    assert CrossEncoderReranker(RerankConfig(model=str(path), max_length=32)).weight_for("3" * 64, "m").weight == 0.0
    stored.write_text("{not json")
    assert CorpusCheck.load(key) is None
    assert CrossEncoderReranker(RerankConfig(model=str(path), max_length=32)).weight_for("3" * 64, "m").source \
        == "unchecked"


class _First:
    name, stages = "fixed", ("fixed",)

    def search(self, queries, k, timer=None):
        return Run({q: [Hit(f"d{i}", 1.0 - i / 10) for i in range(k)] for q in queries})


class _NeverScores:
    config = RerankConfig(model="unused", depth=5)
    interpolation = 0.5

    def score(self, query, texts):
        raise AssertionError("a reranker turned down on this corpus must not be run")


def test_a_weight_of_zero_keeps_the_first_stage_and_scores_nothing():
    from retr.retrieval.rerank import RerankWeight

    rr = RerankRetriever(_First(), _NeverScores(), docstore=None, positions={}, weight=RerankWeight(0.0, "checked"))
    run = rr.search({"q": "anything"}, 8)
    assert [h.doc_id for h in run["q"]] == [f"d{i}" for i in range(8)]


def test_eval_checks_a_reranker_from_another_corpus_and_caps_its_weight(tiny_cross_encoder, tiny_bi_encoder,
                                                                       tmp_path, monkeypatch):
    from retr.eval import pseudo
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.eval.table import main_table
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.pipeline import parse

    docs = _long_docs()
    folder = write_beir(tmp_path / "long", docs, {"q1": "solar panels and electricity", "q2": "wolves in the tundra"},
                        {"q1": {"L1": 1}, "q2": {"L5": 1}})
    ds = load_dataset(str(folder), "test", download=False)
    path = _trained_reranker(tiny_cross_encoder, tmp_path, weight=0.6)
    cfg = EvalConfig(pipelines=tuple(parse(p) for p in ("hybrid", "hybrid+rerank")),
                     encoder=EncoderConfig(model=str(tiny_bi_encoder), max_length=64),
                     reranker=RerankConfig(model=str(path), max_length=32, depth=5), warmup=0)
    report = run_eval(ds, cfg)
    rep = report.to_dict()["reranker"]
    check = rep["corpus_check"]
    assert f"reranker weight {rep['weight']:.1f} (checked): trained on another corpus" in main_table(report)
    assert rep["inputs"] == "head" and "; reads head documents, 32 tokens" in main_table(report)
    assert rep["trained_on_this_corpus"] is False and rep["weight_source"] == "checked"
    assert check["queries"] == len(cut_queries(ds.corpus.docs, PSEUDO_QUERIES, CHECK_SEED)) >= 30
    assert check["corpus_sha256"] == ds.corpus.sha256
    assert len(check["curve"]) == 11 and check["weight"] == checked_weight(check["curve"], check["gain_low"])
    assert set(check["gain_low"]) == set(check["curve"]) - {"0.0"}  # the bound of every weight, stored
    assert rep["weight"] == min(0.6, check["weight"])
    assert all(0.0 <= v <= 1.0 for v in check["curve"].values())

    def no_new_check(*a, **k):
        raise AssertionError("the stored check must be used")

    monkeypatch.setattr(pseudo, "cut_queries", no_new_check)
    again = run_eval(ds, cfg).to_dict()["reranker"]
    assert again["corpus_check"] == check and again["weight"] == rep["weight"]
    off = run_eval(ds, replace(cfg, reranker=replace(cfg.reranker, corpus_check=False))).to_dict()["reranker"]
    assert (off["weight"], off["weight_source"]) == (0.6, "unchecked")  # --no-rerank-check: the trained weight
    given = run_eval(ds, replace(cfg, reranker=replace(cfg.reranker, interpolation=1.0))).to_dict()["reranker"]
    assert (given["weight"], given["weight_source"], given["corpus_check"]) == (1.0, "given", None)


def test_a_corpus_too_short_to_check_keeps_the_trained_weight(tiny_cross_encoder, tiny_bi_encoder, tiny_dataset,
                                                             tmp_path):
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.pipeline import parse

    ds = load_dataset(str(tiny_dataset), "test", download=False)  # 16 documents of about 10 words
    path = _trained_reranker(tiny_cross_encoder, tmp_path, weight=0.6)
    cfg = EvalConfig(pipelines=(parse("hybrid+rerank"),),
                     encoder=EncoderConfig(model=str(tiny_bi_encoder), max_length=64),
                     reranker=RerankConfig(model=str(path), max_length=32, depth=5), warmup=0)
    rep = run_eval(ds, cfg).to_dict()["reranker"]
    assert (rep["weight"], rep["weight_source"], rep["corpus_check"]) == (0.6, "unchecked", None)
    assert np.isfinite(rep["interpolation"])


def test_the_check_step_measures_a_reranker_on_the_index_once_and_searches_read_it(tiny_cross_encoder, tiny_bi_encoder, tmp_path,
                                                             monkeypatch):
    from retr.eval import pseudo
    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import load_corpus
    from retr.indexes.searcher import Searcher
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig

    folder = write_beir(tmp_path / "long", _long_docs(), {"q1": "solar"}, {"q1": {"L1": 1}})
    corpus = load_corpus(folder)
    build_index(corpus, tmp_path / "idx", IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder), max_length=64),
                                                      bm25=BM25Config()))
    path = _trained_reranker(tiny_cross_encoder, tmp_path, weight=0.6)
    calls = []
    # the index holds its documents' vectors: the check reads them there, encoding only the shortened documents
    monkeypatch.setattr(pseudo, "corpus_embeddings", lambda *a, **k: (_ for _ in ()).throw(AssertionError("encoded")))
    searcher = Searcher(tmp_path / "idx", rerank=RerankConfig(model=str(path), max_length=32, depth=5))
    assert searcher.check_applies(searcher.reranker(str(path)))  # trained on another corpus
    # the one explicit step `retr serve`, `retr eval` and `retr check-reranker` take: measured where none is stored
    calls.append(pseudo.check_index_reranker(searcher.index, searcher.encoder, searcher.reranker(str(path))))
    hit = searcher.search("solar panels", k=3, mode="hybrid", rerank=str(path))
    searcher.search("wolves", k=3, mode="hybrid", rerank=str(path))
    assert len(calls) == 1 and calls[0] is not None and calls[0].corpus_sha256 == corpus.sha256  # once per corpus
    weight = searcher.reranker(str(path)).weight_for(corpus.sha256, searcher.index.dense_info["model"]["hash"])
    assert weight.source == "checked" and weight.weight == min(0.6, calls[0].weight) and len(hit.hits) == 3
    searcher.close()
    # another process (a fresh searcher) finds the stored check and measures nothing
    monkeypatch.setattr(pseudo, "cut_queries", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed")))
    again = Searcher(tmp_path / "idx", rerank=RerankConfig(model=str(path), max_length=32, depth=5))
    again.search("solar", k=3, mode="hybrid", rerank=str(path))
    model = again.index.dense_info["model"]["hash"]
    assert again.reranker(str(path)).find_check(corpus.sha256, model) == calls[0]
    # a new generation (a document deleted) keeps the check made before and never stops to measure one
    from retr.indexes.update import delete_documents

    delete_documents(tmp_path / "idx", ["L3"])
    newer = again.reopened()
    changed = newer.index.manifest["corpus"]["sha256"]
    assert changed != corpus.sha256 and newer.reranker(str(path)).needs_check(changed)
    carried = newer.reranker(str(path)).weight_for(changed, model)
    assert carried.source == "checked" and carried.check.weight == calls[0].weight
    assert "L3" not in [h.id for h in newer.search("solar", k=40, mode="hybrid", rerank=str(path)).hits]
    again.close()
    newer.close()


def test_serve_checks_its_reranker_at_startup(tiny_cross_encoder, tiny_bi_encoder, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from retr.cli.main import main
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    from .serving import Server

    folder = write_beir(tmp_path / "long", _long_docs(), {"q1": "solar"}, {"q1": {"L1": 1}})
    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(folder), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--max-length", "64", "--bm25"]) == 0
    path = _trained_reranker(tiny_cross_encoder, tmp_path, weight=0.6)
    assert not (cache_home() / "rerank-checks").exists()
    server = Server(idx, ServeConfig(encoder=EncoderConfig(), rerank=RerankConfig(
        model=str(path), max_length=32, depth=5)))
    try:
        stored = list((cache_home() / "rerank-checks").glob("*.json"))
        assert len(stored) == 1  # measured when the server started, before any request
        check = json.loads(stored[0].read_text())
        status, found = server.request("/search", {"query": "solar panels", "k": 3, "mode": "hybrid", "rerank": True})
        assert status == 200 and found["pipeline"] == "hybrid+rerank" and len(found["results"]) == 3
        assert ("rerank" in found["latency_ms"]) and 0.0 <= check["weight"] <= 1.0
        assert len(list((cache_home() / "rerank-checks").glob("*.json"))) == 1  # and not again
        # a reranked query, long work, takes the search threads even from a lone client; a first-stage one the loop
        dispatch = server.app.state.dispatch
        assert (dispatch.inline, dispatch.pooled) == (0, 1)
        assert server.request("/search", {"query": "solar panels", "k": 3, "mode": "hybrid"})[0] == 200
        assert (dispatch.inline, dispatch.pooled) == (1, 1)
    finally:
        server.stop()


def test_a_model_trained_before_the_rule_gets_its_weight_by_the_rule_from_its_stored_curve(tiny_cross_encoder,
                                                                                           tmp_path):
    # ce1's dev curve (README, "Reranking on other collections"): its raw peak 0.5 sits before a cliff
    values = [0.7722, 0.7756, 0.7787, 0.7794, 0.7840, 0.7875, 0.7574, 0.7310, 0.6952, 0.6645, 0.6267]
    curve = {f"{i / 10:.1f}": v for i, v in enumerate(values)}
    path = _trained_reranker(tiny_cross_encoder, tmp_path)
    manifest = path / "retr_manifest.json"

    def weight(record: dict) -> float:
        manifest.write_text(json.dumps(record))
        return CrossEncoderReranker(RerankConfig(model=str(path), max_length=32)).interpolation

    assert weight({"interpolation": 0.5, "dev_ndcg@10_by_interpolation": curve}) == 0.4  # re-chosen by the rule
    assert weight({"interpolation": 0.5, "dev_ndcg@10_by_interpolation": curve,
                   "interpolation_rule": WEIGHT_RULE}) == 0.5  # chosen by the rule already: kept as stored
    assert weight({"interpolation": 0.5, "dev_ndcg@10_by_interpolation": curve,
                   "interpolation_rule": "smoothed_best"}) == 0.4  # an earlier rule: today's applied
    dip = {**curve, "0.1": 0.7700, "0.2": 0.7730, "0.3": 0.7720, "0.4": 0.7710, "0.5": 0.7700, "0.6": 0.7600}
    assert weight({"interpolation": 0.1, "dev_ndcg@10_by_interpolation": dip,
                   "interpolation_rule": "smoothed_best"}) == 0.2  # not 0.1, below the first stage alone
    assert weight({"interpolation": 0.5}) == 0.5  # no curve to apply it to
    assert weight({}) == 1.0  # not trained by retr: the cross-encoder alone
