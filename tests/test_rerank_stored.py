"""The reranker check stored beside the index (``<index>/rerank-checks/<key>.json``): written by `retr check-reranker`
and `retr index --rerank`, read by a search over a copy of the index on an empty cache, and ignored (with a warning)
where it is damaged, altered or of another corpus."""

from __future__ import annotations

import json
import shutil

import pytest

from retr.cli.main import main
from retr.eval import pseudo
from retr.indexes.searcher import Searcher
from retr.retrieval.rerank import RerankConfig
from retr.retrieval.rerank_check import INDEX_CHECKS

from .conftest import DOCS, write_beir

CE_ARGS = ["--rerank-depth", "5", "--rerank-max-length", "32"]


def _long_docs(n: int = 40) -> list[tuple[str, str, str]]:
    texts = [t for _, _, t in DOCS if t]
    return [(f"L{i}", "", " ".join(texts[(i * k) % len(texts)] for k in (1, 3, 7))) for i in range(n)]


def _other_corpus_ce(tiny_cross_encoder, tmp_path):
    ce = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder, ce)
    (ce / "retr_manifest.json").write_text(json.dumps({"interpolation": 0.6, "corpus_sha256": "0" * 64}))
    return ce

def _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path, rerank: bool = False, queries=None, qrels=None):
    """The long-document collection written as BEIR, a cross-encoder trained on another corpus, and the
    collection indexed (with ``retr index --check-reranker``: its check made and stored beside the index)."""
    folder = write_beir(tmp_path / "long", _long_docs(), queries or {"q1": "solar"}, qrels or {"q1": {"L1": 1}})
    ce = _other_corpus_ce(tiny_cross_encoder, tmp_path)
    idx = tmp_path / "idx"
    extra = ["--check-reranker", str(ce), *CE_ARGS] if rerank else []
    assert main(["index", "--corpus", str(folder), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--max-length", "64", *extra]) == 0
    return folder, ce, idx



def _source(idx, ce) -> str:
    """The weight source a fresh searcher gives ``ce`` on ``idx``."""
    s = Searcher(idx, rerank=RerankConfig(model=str(ce), depth=5, max_length=32))
    try:
        return s.parts.rerank_weight(s.reranker(str(ce))).source
    finally:
        s.close()


def test_index_rerank_stores_the_check_beside_the_index_and_a_copy_keeps_it(tiny_cross_encoder, tiny_bi_encoder,
                                                                            tmp_path, capsys, monkeypatch, caplog):
    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path, rerank=True)
    assert f"{ce} on {idx}: reranker weight" in capsys.readouterr().out
    stored = list((idx / INDEX_CHECKS).glob("*.json"))
    assert len(stored) == 1 and "gain_low" in json.loads(stored[0].read_text())

    copy = tmp_path / "elsewhere" / "idx"
    shutil.copytree(idx, copy)
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "empty-cache"))  # another machine: nothing cached
    monkeypatch.setattr(pseudo, "check_reranker", lambda *a, **k: pytest.fail("a search ran the reranker check"))
    assert _source(copy, ce) == "checked"
    assert main(["search", str(copy), "solar panels", "--mode", "hybrid", "--rerank", str(ce), *CE_ARGS, "--json",
                 "-k", "3"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3
    assert not (tmp_path / "empty-cache" / "rerank-checks").exists()

    # damaged, altered, or of another corpus: ignored with a warning, the trained weight unchecked
    good = json.loads(stored[0].read_text())
    bad = {"not json": b"{", "a field of the wrong type": json.dumps({**good, "depth": "5"}).encode(),
           "an unknown field": json.dumps({**good, "path": "/etc"}).encode(),
           "another corpus": json.dumps({**good, "corpus_sha256": "1" * 64}).encode(),
           "too large": b" " * (70 << 10)}
    beside = copy / INDEX_CHECKS / stored[0].name
    for why, data in bad.items():
        beside.write_bytes(data)
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert _source(copy, ce) == "unchecked", why
        assert any("ignored" in r.getMessage() and str(beside) in r.getMessage() for r in caplog.records), why
    beside.write_text(json.dumps(good))
    assert _source(copy, ce) == "checked"  # and the intact file is read again


def test_check_reranker_stores_beside_the_index_and_a_symlinked_folder_is_not_followed(
        tiny_cross_encoder, tiny_bi_encoder, tmp_path, capsys, monkeypatch, caplog):
    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path)
    assert not (idx / INDEX_CHECKS).exists()
    assert main(["check-reranker", str(idx), str(ce), *CE_ARGS]) == 0
    assert "(checked)" in capsys.readouterr().out
    stored = list((idx / INDEX_CHECKS).glob("*.json"))
    assert len(stored) == 1

    copy = tmp_path / "copy"
    shutil.copytree(idx, copy)
    outside = tmp_path / "outside"
    shutil.move(copy / INDEX_CHECKS, outside)
    (copy / INDEX_CHECKS).symlink_to(outside, target_is_directory=True)
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "empty-cache"))
    with caplog.at_level("WARNING"):
        assert _source(copy, ce) == "unchecked"
    assert any("symlink" in r.getMessage() for r in caplog.records)


def test_a_stored_check_survives_new_generations_and_is_not_used_for_their_corpus(
        tiny_cross_encoder, tiny_bi_encoder, tmp_path, capsys):
    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path, rerank=True)
    stored = list((idx / INDEX_CHECKS).glob("*.json"))
    assert len(stored) == 1 and _source(idx, ce) == "checked"
    added = tmp_path / "new.jsonl"
    added.write_text(json.dumps({"_id": "N1", "text": " ".join(t for _, _, t in DOCS[:6])}) + "\n")
    assert main(["add", str(idx), "--corpus", str(added)]) == 0
    assert main(["compact", str(idx)]) == 0  # superseded generations collected; the checks' folder left alone
    assert list((idx / INDEX_CHECKS).glob("*.json")) == stored
    assert _source(idx, ce) == "unchecked"  # the check is of the corpus before: not used on a fresh open


def test_a_reopened_searcher_takes_the_check_stored_for_its_new_corpus(tiny_cross_encoder, tiny_bi_encoder, tmp_path):
    from retr.retrieval.rerank_check import CorpusCheck

    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path, rerank=True)
    s = Searcher(idx, rerank=RerankConfig(model=str(ce), depth=5, max_length=32))
    try:
        assert s.parts.rerank_weight(s.reranker(str(ce))).source == "checked"
        added = tmp_path / "new.jsonl"
        added.write_text(json.dumps({"_id": "N1", "text": " ".join(t for _, _, t in DOCS[:6])}) + "\n")
        assert main(["add", str(idx), "--corpus", str(added)]) == 0
        carried = s.reopened()
        try:  # no check for the new corpus beside the index yet: the one before carries over
            carried_check = carried.parts.rerank_weight(carried.reranker(str(ce))).check
            assert carried_check is not None and carried_check.corpus_sha256 == carried.parts.corpus_sha256
        finally:
            carried.close()
        assert main(["check-reranker", str(idx), str(ce), *CE_ARGS]) == 0  # measured on the new corpus, stored
        new = s.reopened()
        try:
            f = new.parts
            key = new.check_key(new.reranker(str(ce)))
            stored = CorpusCheck.load_beside(idx, key, f.corpus_sha256, new.reranker(str(ce)).model_hash,
                                             f.dense_model_hash)
            assert stored is not None and f.rerank_weight(new.reranker(str(ce))).check == stored
            assert stored.seconds != carried_check.seconds  # a measurement of its own, not the one carried
        finally:
            new.close()
    finally:
        s.close()


def _spy_builds(monkeypatch) -> list:
    """From here on, every pseudo-query index the reranker check builds is recorded (and still built)."""
    built: list = []
    real = pseudo.build_index

    def spy(*args, **kwargs):
        built.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(pseudo, "build_index", spy)
    return built


def test_eval_index_stores_the_check_it_runs_beside_the_index_and_reads_it_there_next(
        tiny_cross_encoder, tiny_bi_encoder, tmp_path, monkeypatch):
    from retr.eval.report import EvalReport

    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path,
                               queries={"q1": "solar panels", "q2": "wolves in the tundra"},
                               qrels={"q1": {"L1": 1}, "q2": {"L5": 1}})
    assert not (idx / INDEX_CHECKS).exists()

    def evaluate(out) -> dict:
        assert main(["eval", "--index", str(idx), "--topics", str(folder / "queries.jsonl"), "--qrels",
                     str(folder / "qrels" / "test.tsv"), "--mode", "hybrid+rerank", "--rerank", str(ce), *CE_ARGS,
                     "--warmup", "0", "--out", str(out)]) == 0
        return EvalReport.read(out).to_dict()["reranker"]

    built = _spy_builds(monkeypatch)
    first = evaluate(tmp_path / "first.json")
    assert len(built) == 1 and first["weight_source"] == "checked"  # measured once, on pseudo-queries
    stored = list((idx / INDEX_CHECKS).glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["curve"] == first["corpus_check"]["curve"]

    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "empty-cache"))  # a copy elsewhere: nothing cached
    built.clear()
    second = evaluate(tmp_path / "second.json")
    assert built == [] and second["weight_source"] == "checked"  # read beside the index: nothing built
    assert second["corpus_check"] == first["corpus_check"] and second["weight"] == first["weight"]
    assert not (tmp_path / "empty-cache" / "rerank-checks").exists()

    # a check held in the cache alone (the first run's cache) is read from there and stored beside the index
    monkeypatch.delenv("RETR_CACHE")
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "retr-cache"))
    stored[0].unlink()
    third = evaluate(tmp_path / "third.json")
    assert built == [] and third["corpus_check"] == first["corpus_check"]
    assert [p.name for p in (idx / INDEX_CHECKS).glob("*.json")] == [stored[0].name]


def test_serve_stores_the_check_it_runs_beside_the_index_and_reads_it_there_next(
        tiny_cross_encoder, tiny_bi_encoder, tmp_path, monkeypatch, caplog):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    from .serving import Server

    folder, ce, idx = _indexed(tiny_cross_encoder, tiny_bi_encoder, tmp_path)
    cfg = ServeConfig(encoder=EncoderConfig(), rerank=RerankConfig(model=str(ce), max_length=32, depth=5))
    built = _spy_builds(monkeypatch)
    Server(idx, cfg).stop()  # the check is run when the server starts
    stored = list((idx / INDEX_CHECKS).glob("*.json"))
    assert len(built) == 1 and len(stored) == 1

    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "empty-cache"))
    built.clear()
    server = Server(idx, cfg)
    try:
        status, found = server.request("/search", {"query": "solar panels", "k": 3, "mode": "hybrid", "rerank": True})
        assert status == 200 and len(found["results"]) == 3
    finally:
        server.stop()
    assert built == [] and not (tmp_path / "empty-cache" / "rerank-checks").exists()
    assert _source(idx, ce) == "checked"

    # where the check cannot be stored beside the index, the server warns and serves; check-reranker fails
    blocked = tmp_path / "blocked"
    shutil.copytree(idx, blocked)
    shutil.rmtree(blocked / INDEX_CHECKS)
    (blocked / INDEX_CHECKS).write_text("not a folder")
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "another-cache"))
    with caplog.at_level("WARNING"):
        Server(blocked, cfg).stop()
    assert any("not stored beside the index" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "a-third-cache"))
    assert main(["check-reranker", str(blocked), str(ce), *CE_ARGS]) == 2
