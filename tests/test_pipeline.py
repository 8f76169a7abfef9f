"""Pipelines as values: the text form and the operators give the same values; RM3 against a hand-computed
expansion; fusion of three lists against the fusion functions; eval, search (CLI and API) and serve run the same
pipeline to the same hits."""

from __future__ import annotations

import json

import pytest

import retr
from retr.cli.main import main
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import Pipeline, parse, parse_pipelines
from retr.stages import BM25, RM3, Dense, Fuse, Hybrid, Rerank

from .conftest import QUERIES


@pytest.mark.parametrize("text,canonical", [
    ("bm25", "bm25"), ("dense", "dense"), ("hybrid", "hybrid"), ("fuse(bm25,dense)", "hybrid"),
    ("hybrid+rerank", "hybrid+rerank"), ("fuse(bm25, dense) + rerank", "hybrid+rerank"),
    ("dense+rerank", "dense+rerank"), ("bm25+rerank", "bm25+rerank"), ("bm25+rm3", "bm25+rm3"),
    ("fuse(bm25,bm25+rm3,dense)", "fuse(bm25,bm25+rm3,dense)"), ("fuse(dense,bm25)", "fuse(dense,bm25)"),
    ("bm25+rm3(fb_terms=20,fb_docs=5)", "bm25+rm3(fb_docs=5,fb_terms=20)"), ("bm25+rm3(fb_terms=10)", "bm25+rm3"),
    ("fuse(bm25,dense,method=rrf)%50+rerank", "fuse(bm25,dense,method=rrf)%50+rerank"), ("((bm25))", "bm25"),
])
def test_the_text_form_parses_to_a_value_whose_text_parses_back_to_it(text, canonical):
    value = parse(text)
    assert str(value) == canonical and parse(canonical) == value and hash(parse(canonical)) == hash(value)
    assert parse(value) is value  # a value is never parsed again


def test_the_operators_compose_the_values_the_text_names():
    assert BM25() >> RM3() == parse("bm25+rm3")
    assert Fuse(BM25(), Dense()) == Hybrid() == parse("hybrid")
    assert Fuse(BM25(), BM25() >> RM3(fb_docs=5), "dense", method="rrf") >> Rerank() == \
        parse("fuse(bm25,bm25+rm3(fb_docs=5),dense,method=rrf)+rerank")
    assert (Hybrid() % 100).inputs == (Hybrid(),) and str(Dense() % 100 >> Rerank()) == "dense%100+rerank"
    assert parse("hybrid+rerank").needs == {"bm25", "dense", "rerank"} and parse("bm25+rm3").needs == {"bm25"}
    with pytest.raises(AttributeError):
        parse("bm25").stage = "dense"
    with pytest.raises(RetrError, match="must be a step"):
        BM25() >> Dense()
    with pytest.raises(RetrError, match="nothing to apply it to"):
        parse(RM3())


@pytest.mark.parametrize("text,message", [
    ("bm26", "position 1: unknown stage 'bm26'"),
    ("bm25+", "position 6: expected a stage name after \\+, found the end"),
    ("bm25+dense", "position 6: dense is not a step"),
    ("rm3", "position 1: rm3 is a step: it follows a pipeline"),
    ("fuse(bm25)", "position 1: fuse combines two or more pipelines"),
    ("fuse(bm25,dense", "position 16: expected ',' or '\\)', found the end"),
    ("bm25 dense", "position 6: unexpected 'dense'"),
    ("bm25+rm3(fb_terms=0)", "position 6: rm3: option fb_terms is 0"),
    ("bm25+rm3(depth=3)", "position 6: rm3: unknown option 'depth'"),
    ("fuse(bm25,dense,method=max)", "method is 'max': choose one of minmax, zscore, rrf"),
    ("bm25 ; dense", "position 6: unexpected character ';'"),
    ("bm25,dense", "position 5: one pipeline expected, found a list"),
    ("fuse(bm25,dense),bm25", "position 17: one pipeline expected, found a list"),
])
def test_a_bad_expression_is_one_line_naming_the_position(text, message):
    with pytest.raises(RetrError, match=message) as e:
        parse(text)
    assert "\n" not in str(e.value) and repr(text) in str(e.value)


def test_a_list_of_expressions_splits_at_the_commas_outside_parentheses():
    found = parse_pipelines("bm25, bm25+rm3,hybrid,fuse(bm25,bm25+rm3,dense),fuse(bm25,dense)")
    assert [str(p) for p in found] == ["bm25", "bm25+rm3", "hybrid", "fuse(bm25,bm25+rm3,dense)"]
    assert parse_pipelines(["bm25", BM25() >> RM3()]) == found[:2]
    with pytest.raises(RetrError, match="position 1"):
        parse_pipelines(",bm25")


# -- RM3 against a hand-computed expansion ----------------------------------------------------------------------
# 20 documents, so that a term in 2 of them (10%) may feed back and one in 3 (15%) may not. Query "apple": d01 and
# d02 (same length, one "apple" each) get the same BM25 score s, which cancels out of the normalised model.
#   d01 feedback terms: apple 1, banana 2, cherry 1 ("common": in 3 documents; the 21-letter word: too long)
#   d02 feedback terms: apple 1, banana 1, date 2 ("cafe" with an accent is not [a-z0-9])
# fb_terms=10: P(t|d01) = .25 .5 .25, P(t|d02) = apple .25 banana .25 date .5;
#   RM1 = (apple .5, banana .75, cherry .25, date .5) * s / 2s = apple .25, banana .375, cherry .125, date .25
#   RM3 = .5 * (apple 1) + .5 * RM1 = apple .625, banana .1875, cherry .0625, date .125
# fb_terms=2: d01 keeps banana 2 and apple 1 (apple and cherry tie: the term breaks it) -> 1/3, 2/3;
#   d02 keeps date 2 and apple 1 -> 1/3, 2/3; RM1 = apple, banana, date 2/3 s each: cut to 2 (ties: apple,
#   banana) -> .5, .5; RM3 = apple .75, banana .25
RM3_DOCS = ["apple banana banana cherry common abcdefghijklmnopqrstu", "apple banana date date common caf\u00e9",
            "common zebra", *(f"w{i:02d}" for i in range(4, 21))]
HAND = {
    (10, 0.5): {"apple": 0.625, "banana": 0.1875, "cherry": 0.0625, "date": 0.125},
    (2, 0.5): {"apple": 0.75, "banana": 0.25},
    (10, 0.2): {"apple": 0.2 + 0.8 * 0.25, "banana": 0.8 * 0.375, "cherry": 0.8 * 0.125, "date": 0.8 * 0.25},
}


@pytest.fixture(scope="module")
def rm3_bm25(tmp_path_factory):
    from retr.indexes.bm25 import build_bm25
    from retr.retrieval.bm25 import BM25Config, BM25Retriever

    folder = tmp_path_factory.mktemp("rm3") / "bm25"
    build_bm25(RM3_DOCS, folder, BM25Config(stemmer=None, stopwords=None))
    return BM25Retriever(folder, [f"d{i:02d}" for i in range(1, 21)])


@pytest.mark.parametrize("fb_terms,weight", list(HAND))
def test_rm3_expands_the_query_as_computed_by_hand(rm3_bm25, fb_terms, weight):
    from retr.retrieval.rm3 import RM3Retriever

    positions = {d: i for i, d in enumerate(rm3_bm25.ids)}
    rm3 = RM3Retriever(rm3_bm25, rm3_bm25, positions, fb_terms=fb_terms, fb_docs=10, original_query_weight=weight)
    first = rm3_bm25.search({"q": "apple"}, 10)["q"]
    assert [h.doc_id for h in first] in (["d01", "d02"], ["d02", "d01"]) and first[0].score == first[1].score
    got = rm3.expansion("apple", first)
    assert got.keys() == HAND[fb_terms, weight].keys()
    assert all(got[t] == pytest.approx(v, abs=1e-12) for t, v in HAND[fb_terms, weight].items())
    # the second pass scores each document sum_t w_t * BM25(t, d): bm25s's own per-term scores as the reference
    run = rm3.search({"q": "apple"}, 20)["q"]
    model = rm3_bm25.model
    want = {d: sum(w * float(model.get_scores([t])[i]) for t, w in got.items()) for i, d in enumerate(rm3_bm25.ids)}
    assert {h.doc_id for h in run} == {d for d, s in want.items() if s > 0}
    assert all(h.score == pytest.approx(want[h.doc_id], rel=1e-6) for h in run)
    assert [h.score for h in run] == sorted((h.score for h in run), reverse=True)


def test_rm3_without_feedback_searches_the_query_alone(rm3_bm25):
    from retr.retrieval.rm3 import RM3Retriever

    rm3 = RM3Retriever(rm3_bm25, rm3_bm25, {d: i for i, d in enumerate(rm3_bm25.ids)})
    assert rm3.expansion("zebra zebra", []) == {"zebra": 0.5}
    plain, expanded = rm3_bm25.search({"q": "zebra"}, 5)["q"], rm3.search({"q": "zebra"}, 5)["q"]
    assert [h.doc_id for h in expanded] == [h.doc_id for h in plain] == ["d03"]


# -- the pipelines over a real index ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tiny_dataset, tiny_bi_encoder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipelines") / "idx"
    retr.Index.build(tiny_dataset, folder, model=str(tiny_bi_encoder), backend="onnx").close()
    return folder


def test_fusion_of_three_lists_is_the_fusion_functions_over_the_three_runs(built):
    from retr.indexes.searcher import Searcher
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.fusion import minmax, rrf
    from retr.retrieval.pipeline import PipelineConfig

    s = Searcher(built, EncoderConfig(backend="onnx"), PipelineConfig(fusion_depth=8))
    try:
        lists = [s.retriever(parse(p)).search(QUERIES, 8) for p in ("bm25", "bm25+rm3", "dense")]
        for method, fuse in (("minmax", lambda runs: minmax(runs, 5, depth=8)), ("rrf", lambda runs: rrf(runs, 5))):
            got = s.retriever(parse(f"fuse(bm25,bm25+rm3,dense,method={method})")).search(QUERIES, 5)
            assert got == fuse(lists)
        # RRF by hand for one query: sum over the three lists of 1 / (60 + rank)
        q = "q1"
        ranks = [{h.doc_id: r for r, h in enumerate(run[q], start=1)} for run in lists]
        by_hand = {d: sum(1.0 / (60 + r[d]) for r in ranks if d in r) for r in ranks for d in r}
        got = s.retriever(parse("fuse(bm25,bm25+rm3,dense,method=rrf)")).search({q: QUERIES[q]}, 5)[q]
        assert [(h.doc_id, h.score) for h in got] == \
            sorted(by_hand.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:5]
        assert len({h.doc_id for run in lists for h in run[q]}) > 5  # the lists differ: a real fusion
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["fuse(bm25,dense)", "bm25+rm3", "fuse(bm25,bm25+rm3,dense)"])
def test_eval_search_api_and_serve_give_the_same_hits_for_one_expression(built, tiny_dataset, tmp_path, capsys,
                                                                          mode):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from retr.eval.trec import read_run
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    from .serving import Server

    qid, query = "q4", QUERIES["q4"]
    runs = tmp_path / "runs"
    assert main(["eval", "--index", str(built), "--topics", str(tiny_dataset / "queries.jsonl"), "--qrels",
                 str(tiny_dataset / "qrels" / "test.tsv"), "--mode", f"bm25,{mode}", "--k-values", "10",
                 "--backend", "onnx", "--warmup", "0", "--run-dir", str(runs)]) == 0
    table = capsys.readouterr().out
    assert str(parse(mode)) in table and "bm25 " in table  # a row each
    (run_file,) = [f for f in runs.iterdir() if f.name.endswith(".trec") and not f.name.endswith(".bm25.trec")]
    evaluated = [(h.doc_id, round(h.score, 4)) for h in read_run(run_file)[qid]]
    with retr.Index.load(built, backend="onnx") as index:
        api = index.search(query, mode=mode)
        composed = index.search(query, mode=parse(mode))  # the value, as retr.stages composes it
    assert main(["search", str(built), query, "--mode", mode, "--json", "--backend", "onnx"]) == 0
    cli = json.loads(capsys.readouterr().out)
    server = Server(built, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        status, served = server.request("/search", {"query": query, "mode": mode})
        bad, refused = server.request("/search", {"query": query, "mode": "bm25+"})
    finally:
        server.stop()
    want = [(h.id, round(h.score, 4)) for h in api.hits]
    assert len(want) >= 3 and api.pipeline == str(parse(mode)) == cli["pipeline"] == served["pipeline"]
    assert evaluated == want
    assert [(h.id, round(h.score, 4)) for h in composed.hits] == want
    assert [(h["id"], round(h["score"], 4)) for h in cli["results"]] == want
    assert status == 200 and [(h["id"], round(h["score"], 4)) for h in served["results"]] == want
    assert bad == 422 and "position 6" in refused["error"]


def test_a_rerank_expression_without_a_cross_encoder_is_refused_at_each_door(built, capsys):
    with retr.Index.load(built, backend="onnx") as index:
        with pytest.raises(RetrError, match="needs a cross-encoder"):
            index.search("wolves", mode="fuse(bm25,dense)+rerank")
    assert main(["search", str(built), "wolves", "--mode", "bm25+rerank", "--backend", "onnx"]) != 0
    assert "needs a cross-encoder" in capsys.readouterr().err


def test_a_pipeline_is_a_value_that_pickles_and_deep_copies():
    import copy
    import pickle

    p = parse("fuse(bm25,bm25+rm3(fb_docs=3),dense,method=rrf)+rerank")
    assert pickle.loads(pickle.dumps(p)) == p and copy.deepcopy(p) == p and isinstance(p, Pipeline)


def test_eval_of_a_dataset_reports_a_row_per_expression(tiny_dataset, tiny_bi_encoder, tmp_path, capsys):
    report = tmp_path / "r.json"
    modes = "bm25,bm25+rm3,hybrid,fuse(bm25,bm25+rm3,dense),fuse(bm25,dense)"  # the last is hybrid: one row
    assert main(["eval", "--dataset", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--backend", "onnx",
                 "--mode", modes, "--k-values", "1,10", "--warmup", "0", "--out", str(report)]) == 0
    rep = json.loads(report.read_text())
    names = ["bm25", "bm25+rm3", "hybrid", "fuse(bm25,bm25+rm3,dense)"]
    assert list(rep["pipelines"]) == names and rep["config"]["pipelines"] == names
    assert set(rep["pipelines"]["fuse(bm25,bm25+rm3,dense)"]["latency_ms"]) == \
        {"bm25", "rm3", "encode", "ann", "fusion", "total"}
    table = capsys.readouterr().out
    assert all(f"\n{n} " in table for n in names)
    # a bad expression: one line naming its position, before any dataset is read
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25,fuse(bm25"]) == 2
    assert "pipeline 'bm25,fuse(bm25', position 15: expected ',' or ')', found the end" in capsys.readouterr().err
