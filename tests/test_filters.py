"""Metadata filters: every stage searches only the matching documents, and k of them come back whenever k exist —
for every index kind and mode, equal to the unfiltered ranking restricted to the matches."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.indexes.searcher import Searcher
from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import DEFAULT_FUSION, FUSIONS
from retr.retrieval.types import Hit, Run

from .conftest import DOCS

TOPIC = {"d1": "energy", "d2": "energy", "d3": "energy", "d13": "energy", "d4": "food", "d5": "food", "d6": "food",
         "d14": "food", "d7": "animals", "d8": "animals", "d9": "animals", "d16": "animals"}
QUERIES = ["solar electricity", "wolves and dogs", "hot water", "mountains rivers"]
FILTERS = [{"topic": "energy"}, {"topic": "animals", "year": 2020}, {"even": True}]


def _record(i: int, did: str, title: str, text: str) -> dict:
    rec = {"_id": did, "title": title, "text": text, "year": 2020 if i % 3 else 2021, "even": i % 2 == 0}
    if did in TOPIC:
        rec["topic"] = TOPIC[did]
    return rec


@pytest.fixture(scope="module")
def indexes(tiny_bi_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps(_record(i, *d)) + "\n" for i, d in enumerate(DOCS)))
    out = {}
    for kind, extra in (("flat", []), ("hnsw", []), ("ivfpq", []), ("lean", []), ("hnsw-ef1", ["--ef-search", "1"])):
        folder = root / kind
        assert main(["index", "--corpus", str(corpus), "--out", str(folder), "--model", str(tiny_bi_encoder),
                     "--backend", "onnx", "--bm25", "--kind", kind.split("-")[0], *extra]) == 0
        out[kind] = Searcher(folder, EncoderConfig(backend="onnx"))
    return corpus, out


def _matching(cond: dict) -> set[str]:
    return {d for i, (d, t, x) in enumerate(DOCS) if all(_record(i, d, t, x).get(k) == v for k, v in cond.items())}


def _restricted(hits, allowed: set[str], k: int) -> list[tuple[str, float]]:
    return [(h.id, h.score) for h in hits if h.id in allowed][:k]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq", "lean", "hnsw-ef1"])
@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_filtered_search_equals_the_unfiltered_ranking_restricted(indexes, kind, mode):
    _, searchers = indexes
    s = searchers[kind]
    n = len(DOCS)
    for cond in FILTERS:
        allowed = _matching(cond)
        assert allowed, cond
        for q in QUERIES:
            for k in (2, 5, n):
                got = s.search(q, k, mode, filter=cond)
                assert all(h.id in allowed for h in got.hits)
                assert all(all(h.metadata.get(f) == v for f, v in cond.items()) for h in got.hits)
                ids_scores = [(h.id, h.score) for h in got.hits]
                if mode == "hybrid":  # the default fusion of the two filtered lists, each the unfiltered one restricted
                    depth = max(k, 100)
                    dense = _restricted(searchers["flat" if kind == "hnsw-ef1" else kind]
                                        .search(q, n, "dense").hits, allowed, depth)
                    bm25 = _restricted(s.search(q, n, "bm25").hits, allowed, depth)
                    want = FUSIONS[DEFAULT_FUSION]([Run({"q": [Hit(*x) for x in dense]}),
                                                    Run({"q": [Hit(*x) for x in bm25]})], k, 60, None, 100)["q"]
                    assert [h.id for h in got.hits] == [h.doc_id for h in want], (cond, q, k)
                    continue
                # hnsw-ef1's own unfiltered search is too narrow to be a reference: flat's exact ranking is
                ref = searchers["flat"] if kind == "hnsw-ef1" else s
                want = _restricted(ref.search(q, n, mode).hits, allowed, k)
                assert [sc for _, sc in ids_scores] == pytest.approx([sc for _, sc in want], rel=1e-5, abs=1e-6)
                # ids agree wherever scores are not tied (the tiny IVF-PQ's 1-bit codes give exact ties that float
                # rounding may order either way)
                tied = {round(sc, 5) for sc in [x for _, x in want]
                        if sum(abs(sc - y) < 1e-5 for _, y in want) > 1 or abs(sc - want[-1][1]) < 1e-5}
                assert [i for i, sc in ids_scores if round(sc, 5) not in tied] == \
                    [i for i, sc in want if round(sc, 5) not in tied], (cond, q, k)
                if mode == "dense":  # dense always fills k when k matching documents exist
                    assert len(got.hits) == min(k, len(allowed))


def test_filters_from_the_cli_and_unknown_fields(indexes, capsys):
    _, searchers = indexes
    folder = searchers["flat"].index.folder
    assert main(["search", str(folder), "solar", "--filter", "topic=food", "--filter", "year=2020", "--json",
                 "-k", "10", "--backend", "onnx"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    assert {r["id"] for r in res} == _matching({"topic": "food", "year": 2020}) and len(res) > 0
    assert main(["search", str(folder), "solar", "--filter", "colour=red", "--backend", "onnx"]) == 2
    assert "no document has a field 'colour' to filter on" in capsys.readouterr().err
    with pytest.raises(RetrError, match="no document has a field"):
        searchers["flat"].search("solar", 3, "dense", filter={"nope": 1})
    assert searchers["flat"].search("solar", 3, "dense", filter={"topic": "volcanoes"}).hits == []
