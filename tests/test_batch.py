"""Batch search: `retr search IDX --topics FILE --out RUN` and ``Index.search_topics`` give each query the hits
and scores a single search gives it; topics -> TREC run -> `retr eval --run` scores as `retr eval --dataset` to the
last digit; ``Index.from_documents`` indexes strings and dicts held in memory."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.eval.report import EvalReport
from retr.eval.trec import read_run
from retr.indexes.searcher import Searcher
from retr.retrieval.errors import RetrError

from .conftest import DOCS, QUERIES

TOPICS = {q: t for q, t in QUERIES.items() if q != "q6"} | {"q7": "water", "q8": "wolves and dogs"}


@pytest.fixture(scope="module")
def index(tiny_dataset, tiny_bi_encoder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch") / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(folder), "--model", str(tiny_bi_encoder)]) == 0
    return folder


def _topics(tmp_path, topics=TOPICS):
    path = tmp_path / "topics.tsv"
    path.write_text("".join(f"{q}\t{t}\n" for q, t in topics.items()), encoding="utf-8")
    return path


def _single(folder, mode, k, **options):
    s = Searcher(folder)
    try:
        return {q: [(h.id, h.score) for h in s.search(t, k=k, mode=mode, **options).hits] for q, t in TOPICS.items()}
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_batch_search_equals_single_searches(index, tmp_path, capsys, mode):
    out = tmp_path / "run.trec"
    assert main(["search", str(index), "--topics", str(_topics(tmp_path)), "--out", str(out), "--mode", mode,
                 "-k", "5", "--run-tag", "mine", "--query-batch", "3"]) == 0  # chunks of 3: 7 topics in 3 chunks
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"searched 7 topics ({mode}, k=5) in ") and "queries/s" in line and str(out) in line
    run = read_run(out)
    single = _single(index, mode, 5)
    assert {q: [(h.doc_id, h.score) for h in hits] for q, hits in run.items()} == \
        {q: hits for q, hits in single.items() if hits}  # ids and scores, exactly
    assert out.read_text().split("\n", 1)[0].endswith(" mine")


def test_batch_search_with_filter_and_every_format(index, tmp_path, capsys):
    topics = _topics(tmp_path)
    for fmt in ("msmarco", "jsonl"):
        out = tmp_path / f"run.{fmt}"
        assert main(["search", str(index), "--topics", str(topics), "--out", str(out), "--format", fmt,
                     "--mode", "bm25", "-k", "3"]) == 0
        assert [[h.doc_id for h in hits] for hits in read_run(out).values()] == \
            [[d for d, _ in hits] for hits in _single(index, "bm25", 3).values() if hits or fmt == "jsonl"]
    # the API: a mapping or a topic file, the same run; a filter as in a single search
    import retr

    with retr.Index.load(index) as idx:
        by_file = idx.search_topics(topics, k=4, mode="hybrid")
        assert by_file == idx.search_topics(dict(TOPICS), k=4, mode="hybrid")
        assert {q: [(h.doc_id, h.score) for h in hits] for q, hits in by_file.items()} == _single(index, "hybrid", 4)
        assert idx.search_topics({"a": "water"}, k=10, mode="bm25")["a"]


def test_batch_search_with_rerank(index, tmp_path, tiny_cross_encoder, monkeypatch):
    from retr.retrieval.rerank import CrossEncoderReranker

    told = []
    expect = CrossEncoderReranker.expect
    monkeypatch.setattr(CrossEncoderReranker, "expect", lambda self, n: told.append(n) or expect(self, n))
    out = tmp_path / "run.trec"
    assert main(["search", str(index), "--topics", str(_topics(tmp_path)), "--out", str(out), "--mode", "bm25",
                 "--rerank", str(tiny_cross_encoder), "--no-rerank-check", "-k", "4"]) == 0
    assert told == [len(TOPICS)]  # told how many queries it reranks (its int8 graph made where they repay it)
    from retr.retrieval.rerank import RerankConfig

    s = Searcher(index, rerank=RerankConfig(model=str(tiny_cross_encoder), corpus_check=False))
    try:
        single = {q: [(h.id, h.score) for h in s.search(t, k=4, mode="bm25", rerank=str(tiny_cross_encoder)).hits]
                  for q, t in TOPICS.items()}
    finally:
        s.close()
    assert {q: [(h.doc_id, h.score) for h in hits] for q, hits in read_run(out).items()} == \
        {q: hits for q, hits in single.items() if hits}


def test_bm25_threads_give_the_same_run(index):
    from retr.retrieval.bm25 import BM25Retriever

    folder = Searcher(index)
    try:
        bm25 = BM25Retriever(folder.index.bm25_folder, folder.index.ids)
    finally:
        folder.close()
    queries = {f"{q}-{i}": t for i in range(12) for q, t in TOPICS.items()}
    bm25.threads = 1
    one = bm25.search(queries, 5)
    bm25.threads = 2
    assert bm25.search(queries, 5) == one and len(one) == len(queries)


def test_batch_search_input_errors(index, tmp_path, capsys):
    topics = _topics(tmp_path)
    cases = [
        (["search", str(index), "--topics", str(topics)], "--topics needs --out RUN"),
        (["search", str(index)], "give a query, or --topics FILE"),
        (["search", str(index), "water", "--topics", str(topics), "--out", "x"], "not both"),
        (["search", str(index), "--topics", str(topics), "--out", str(tmp_path / "r"), "--run-tag", "a b"],
         "run tag 'a b'"),
        (["search", str(index), "--topics", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "r")],
         "none.tsv: no such topic file"),
    ]
    for argv, message in cases:
        assert main(argv) != 0, argv
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and not x.startswith("[retr]")]
        assert len(err) == 1 and message in err[0], (argv, err)
    assert not (tmp_path / "r").exists()


def test_topics_to_run_to_eval_run_equals_eval_dataset(index, tiny_dataset, tiny_bi_encoder, tmp_path, capsys):
    """The workflow: topics -> `retr search --topics` -> TREC run -> `retr eval --run`: every metric equal to
    `retr eval --dataset` on the same data, to the last digit."""
    queries = tiny_dataset / "queries.jsonl"  # BEIR's queries file is a topic file
    for mode in ("bm25", "hybrid"):
        report = tmp_path / f"{mode}.json"
        assert main(["eval", "--dataset", str(tiny_dataset), "--modes", mode, "--model", str(tiny_bi_encoder),
                     "--warmup", "0", "--out", str(report)]) == 0
        run = tmp_path / f"{mode}.trec"
        assert main(["search", str(index), "--topics", str(queries), "--out", str(run), "--mode", mode,
                     "-k", "1000"]) == 0
        scored = tmp_path / f"{mode}-run.json"
        assert main(["eval", "--run", str(run), "--qrels", str(tiny_dataset / "qrels" / "test.tsv"),
                     "--out", str(scored)]) == 0
        expected = EvalReport.read(report).pipelines[mode]
        got = EvalReport.read(scored).pipelines[mode]
        assert got.metrics == expected.metrics and got.per_query == expected.per_query, mode
    capsys.readouterr()


def test_from_documents_strings_dicts_and_out(tmp_path, tiny_bi_encoder, tiny_dataset):
    import retr

    with retr.Index.from_documents(["the cat sat on the mat", "dogs chase cats", "rivers flow to the sea"],
                                   model=str(tiny_bi_encoder)) as idx:
        temp = idx._temp
        assert temp.is_dir() and idx.ids == ["0", "1", "2"]
        assert idx.search("rivers sea", k=1, mode="bm25").hits[0].id == "2"
    assert not temp.exists()  # removed on close

    docs = [{"_id": d, "title": t, "text": x, "topic": "energy" if d in ("d1", "d2", "d3") else "other"}
            for d, t, x in DOCS]
    out = tmp_path / "mine"
    with retr.Index.from_documents(docs, out, model=str(tiny_bi_encoder)) as idx:
        hits = idx.search("electricity", k=10, mode="bm25", filter={"topic": "energy"}).hits
        assert hits and {h.id for h in hits} <= {"d1", "d2", "d3"} and hits[0].metadata == {"topic": "energy"}
    assert (out / "manifest.json").is_file()  # stays: the folder `retr index` writes
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "cli"), "--model", str(tiny_bi_encoder)]) == 0
    with retr.Index.load(out) as a, retr.Index.load(tmp_path / "cli") as b:
        assert a.manifest["corpus"]["sha256"] == b.manifest["corpus"]["sha256"]
        assert a.search_topics(dict(TOPICS), k=5) == b.search_topics(dict(TOPICS), k=5)


@pytest.mark.parametrize("docs,message", [
    ("just a string", "docs must be a list of str or dict"),
    ([{"title": "t", "text": 3}], r"docs\[0\]\['text'\] must be a str"),
    ([{"id": "a", "_id": "b", "text": "x"}], "has both 'id' and '_id'"),
    ([{"body": "x"}], r"docs\[0\] has no 'text'"),
    ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "duplicate document id 'a'"),
    ([], "holds no documents"),
])
def test_from_documents_refuses_bad_input(docs, message, tiny_bi_encoder):
    import retr

    with pytest.raises(RetrError, match=message):
        retr.Index.from_documents(docs, model=str(tiny_bi_encoder))
