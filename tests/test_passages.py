"""Long documents: passages split on the encoder's tokens, indexes of passages for every kind and mode, passage
scores folded into documents' exactly as a brute-force MaxP/FirstP/sum over the same vectors, truncation reported."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from retr.cli.main import main
from retr.indexes.build import IndexConfig, build_index
from retr.indexes.corpus import load_corpus
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.folder import IndexFolder
from retr.indexes.searcher import Searcher
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.compose import IndexParts, build
from retr.retrieval.dense import PASSAGE_DEPTH
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageConfig, PassageMap, split_passages, windows
from retr.retrieval.pipeline import PipelineConfig, parse
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

from .conftest import DOCS, QRELS, write_beir
from .conftest import QUERIES as FIXTURE_QUERIES

SENTENCES = [f"{t} {x}" for _, t, x in DOCS if x]
QUERIES = {"q1": "solar panels electricity", "q2": "wolves in the tundra", "q3": "bread baked in an oven",
           "q4": "lava and volcanoes", "q5": "tea with hot water"}
PASSAGES = "24:12"


def _long_docs() -> list[tuple[str, str, str]]:
    """The fixture's documents and six long ones (4-8x the tiny encoder's 64 tokens), each a run of its
    sentences in a seeded order."""
    rng = np.random.default_rng(3)
    long = []
    for i in range(6):
        order = rng.permutation(len(SENTENCES))[: 8 + 4 * i]
        long.append((f"long{i}", f"Long {i}" if i % 2 else "", " ".join(SENTENCES[j] for j in order) * 2))
    return [*DOCS, *long]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": d, "title": t, "text": x, "topic": "long" if d.startswith("long")
                                        else "short"}) + "\n" for d, t, x in _long_docs()))
    return path


@pytest.fixture(scope="module")
def encoder(tiny_bi_encoder):
    return BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"))


@pytest.fixture(scope="module")
def built(corpus_file, encoder, tiny_bi_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("passage-indexes")
    corpus = load_corpus(corpus_file)
    out = {}
    for kind in ("flat", "hnsw", "ivfpq"):
        cfg = IndexConfig(dense=DenseIndexConfig(kind=kind, nprobe=64), bm25=BM25Config(),
                          encoder=EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"),
                          passages=PassageConfig.parse(PASSAGES))
        build_index(corpus, root / kind, cfg, encoder=encoder)
        out[kind] = IndexFolder(root / kind)
    build_index(corpus, root / "docs", IndexConfig(bm25=BM25Config(), encoder=EncoderConfig(
        model=str(tiny_bi_encoder), backend="onnx")), encoder=encoder)
    out["docs"] = IndexFolder(root / "docs")
    return corpus, out


def test_windows_cover_every_token_within_size_and_snap_to_sentences():
    starts = np.array([0, 10, 23, 31, 50, 58, 77])
    for n, size, stride in ((100, 20, 10), (100, 20, 20), (9, 20, 10), (200, 30, 7), (64, 16, 16)):
        got = windows(n, starts[starts < n], size, stride)
        assert got[0][0] == 0 and got[-1][1] == n
        assert all(0 < b - a <= size for a, b in got)
        assert all(a2 <= b1 for (_, b1), (a2, _) in zip(got, got[1:], strict=False)), "no token left out"
        assert all(a2 > a1 for (a1, _), (a2, _) in zip(got, got[1:], strict=False)), "always moves on"
    got = windows(100, starts, 24, 12)
    assert got[0] == (0, 23) and got[1][0] == 10, "ends and starts move back to a sentence start in reach"
    assert windows(100, np.array([0]), 20, 20) == [(0, 20), (20, 40), (40, 60), (60, 80), (80, 100)]


def test_split_passages_fit_the_budget_keep_titles_and_cover_the_body(encoder):
    cfg = PassageConfig(24, 12)
    titles = ["Long title here", "", ""]
    bodies = [" ".join(SENTENCES[:6]), "", SENTENCES[0]]
    split = split_passages(titles, bodies, cfg, encoder.tokens.token_offsets,
                           lambda t: encoder.tokens.token_counts(t, special=False).tolist())
    assert split.docs.tolist()[0] == 0 and sorted(set(split.docs.tolist())) == [0, 1, 2], "every document has one"
    counts = encoder.tokens.token_counts(split.texts, special=False)
    assert counts.max() <= 24
    first = [t for t, d in zip(split.texts, split.docs.tolist(), strict=True) if d == 0]
    assert len(first) > 2 and all(t.startswith("Long title here ") for t in first)
    spans = split.spans[split.docs == 0]
    assert spans[0, 0] == 0 and spans[-1, 1] == len(bodies[0].rstrip())
    assert all(not bodies[0][int(b1):int(a2)].strip() for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False)), \
        "nothing between one passage and the next but spaces"
    assert split.texts[split.docs.tolist().index(2)] == SENTENCES[0]
    with pytest.raises(RetrError, match="N or N:STRIDE"):
        PassageConfig.parse("abc")
    with pytest.raises(RetrError, match="stride 40 must be between"):
        PassageConfig.parse("32:40")
    assert PassageConfig.parse("32") == PassageConfig(32, 16)


def _brute(encoder, index: IndexFolder, aggregate: str, k: int, allowed: set[str] | None = None):
    """Each query's top-k documents by ``aggregate`` over every passage vector (numpy; sum: over the passages a
    search reaches)."""
    import faiss

    whole = faiss.read_index(str(index.folder / index.dense_info["file"]))  # IVF-PQ: its codes, decoded
    if index.dense_info["kind"] == "ivfpq":
        faiss.extract_index_ivf(whole).make_direct_map()
    vectors = whole.reconstruct_n(0, whole.ntotal)
    docs = np.asarray(index.passages.docs)
    out = {}
    q = encoder.encode_queries(list(QUERIES.values()))
    for qi, qid in enumerate(QUERIES):
        s = vectors @ q[qi]
        searched = set(np.argsort(-s)[: max(4 * k, PASSAGE_DEPTH)].tolist())  # sum: over the passages searched
        per = {}
        for row, d in enumerate(docs.tolist()):
            if aggregate == "firstp" and row and docs[row - 1] == d:
                continue
            if aggregate == "sum" and row not in searched:
                continue
            per.setdefault(d, []).append(float(s[row]))
        agg = {d: (sum(v) if aggregate == "sum" else max(v)) for d, v in per.items()
               if allowed is None or index.ids[d] in allowed}
        out[qid] = sorted(agg.items(), key=lambda kv: -kv[1])[:k]
    return out


def _assert_same_top(got: list[tuple[str, float]], want: list[tuple[str, float]], tol: float = 1e-5) -> None:
    """The same top-k up to float noise: equal scores rank by rank, and the same documents except where two
    scores tie (a long document's passage can be a short document's whole text)."""
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=tol)
    last = want[-1][1]
    assert {d for d, s in got if s > last + tol} == {d for d, s in want if s > last + tol}


@pytest.mark.parametrize("aggregate", ["maxp", "firstp", "sum"])
@pytest.mark.parametrize("kind", ["flat", "ivfpq"])
def test_passage_search_equals_brute_force_aggregation(built, encoder, kind, aggregate):
    corpus, indexes = built
    index = indexes[kind]
    k = 6
    run = IndexParts(index, encoder).dense(aggregate=PipelineConfig(passage_aggregate=aggregate).passage_aggregate
                                            ).search(QUERIES, k)
    want = _brute(encoder, index, aggregate, k)
    for qid in QUERIES:
        got = [(h.doc_id, h.score) for h in run[qid]]
        assert len(got) == k
        # IVF-PQ probes every list here: its scores are the decoded codes' (float32 lookup tables: to 1e-4)
        _assert_same_top(got, [(index.ids[d], s) for d, s in want[qid]], 1e-5 if kind == "flat" else 1e-4)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_every_kind_and_mode_fills_k_documents_and_filters_hold(built, kind, mode, tiny_bi_encoder):
    corpus, indexes = built
    s = Searcher(indexes[kind].folder, EncoderConfig(backend="onnx"))
    n = len(corpus)
    for q in QUERIES.values():
        hits = s.search(q, k=n, mode=mode).hits
        ids = [h.id for h in hits]
        assert len(ids) == len(set(ids)), "a document once, however many of its passages match"
        if mode != "bm25":
            assert len(ids) == n, "k documents whenever k exist"
        only_long = s.search(q, k=4, mode=mode, filter={"topic": "long"}).hits
        assert {h.id for h in only_long} <= {d for d, _, _ in _long_docs() if d.startswith("long")}
        if mode != "bm25":
            assert len(only_long) == 4
    if mode == "dense" and kind == "flat":
        want = _brute(s.encoder, indexes[kind], "maxp", 3, allowed={d for d, _, _ in _long_docs()
                                                                     if d.startswith("long")})
        for qid, q in QUERIES.items():
            got = [(h.id, h.score) for h in s.search(q, k=3, mode="dense", filter={"topic": "long"}).hits]
            _assert_same_top(got, [(indexes[kind].ids[d], v) for d, v in want[qid]])
    s.close()


def test_rerank_scores_the_best_passages_of_long_documents(built, encoder, tiny_cross_encoder):
    corpus, indexes = built
    reranker = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), depth=8, max_length=64))
    seen = []
    score = reranker.score
    reranker.score = lambda q, texts: (seen.append(list(texts)), score(q, texts))[1]
    run = build(parse("dense+rerank"), IndexParts(indexes["flat"], encoder), reranker=reranker).search(QUERIES, 8)
    assert all(len(h) == 8 and len({x.doc_id for x in h}) == 8 for h in run.values())
    longest = max(len(t) for batch in seen for t in batch)
    full = max(len(d.full_text()) for d in corpus.docs)
    assert longest < full, "a long document is read as passages, never whole"
    assert sum(len(b) for b in seen) > 8 * len(QUERIES), "two passages of a long candidate"


def test_truncation_is_counted_in_the_manifest_and_warned(built, encoder, caplog):
    corpus, indexes = built
    t = indexes["docs"].dense_info["truncation"]
    counts = encoder.tokens.token_counts([d.full_text() for d in corpus.docs])
    assert t["max_length"] == 64 and t["texts"] == len(corpus)
    assert t["truncated"] == int((counts > 64).sum()) >= 6
    assert t["tokens_dropped"] == int(np.clip(counts - 64, 0, None).sum())
    assert t["share_tokens_dropped"] == pytest.approx(t["tokens_dropped"] / counts.sum())
    p = indexes["flat"].dense_info
    assert p["truncation"]["truncated"] == 0 and p["passages"]["count"] == indexes["flat"].faiss_index.ntotal
    assert p["passages"]["count"] > len(corpus)
    with caplog.at_level(logging.WARNING, logger="retr.indexes.build"):
        from retr.indexes.build import truncation_report

        truncation_report(encoder, [d.full_text() for d in corpus.docs], "documents")
    assert "--passages" in caplog.text and "longer than the encoder's 64 tokens" in caplog.text


def test_cli_passages_eval_report_and_refusals(corpus_file, tiny_bi_encoder, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus_file), "--out", str(out), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--passages", "20:10", "--aggregate", "sum"]) == 0
    assert "passages" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert m["dense"]["passages"]["aggregate"] == "sum" and m["dense"]["passages"]["size"] == 20
    assert main(["search", str(out), "wolves", "--mode", "hybrid", "--json", "--passage-aggregate", "maxp"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"]
    assert len(hits) == 10 and len({h["id"] for h in hits}) == 10
    assert main(["index", "--corpus", str(corpus_file), "--out", str(tmp_path / "big"), "--model",
                 str(tiny_bi_encoder), "--backend", "onnx", "--passages", "63"]) != 0
    err = capsys.readouterr().err
    assert "--passages 63: longer than the encoder takes (64 tokens" in err and "at most 62" in err
    assert not (tmp_path / "big").exists()
    (tmp_path / "ids.txt").write_text("long1\n")
    assert main(["delete", str(out), "--ids", str(tmp_path / "ids.txt")]) != 0
    assert "an index of passages cannot change yet" in capsys.readouterr().err
    PassageMap(np.zeros(3, dtype=np.int32), None)  # one document of three passages
    with pytest.raises(RetrError, match="unknown passage aggregate"):
        PipelineConfig(passage_aggregate="mean")


def test_eval_reports_truncation_and_scores_documents_over_passages(tiny_bi_encoder, tmp_path, capsys):
    data = write_beir(tmp_path / "long", _long_docs(), FIXTURE_QUERIES, QRELS)
    common = ["eval", "--dataset", str(data), "--model", str(tiny_bi_encoder), "--backend", "onnx", "--no-download",
              "--pipelines", "dense,hybrid", "--warmup", "0", "--no-cache"]
    assert main([*common, "--out", str(tmp_path / "docs.json")]) == 0
    printed = capsys.readouterr().out
    assert "truncated at 64 tokens: 6 of 22 documents (27.3%)" in printed
    assert main([*common, "--passages", "20:10", "--out", str(tmp_path / "passages.json")]) == 0
    printed = capsys.readouterr().out
    assert "truncated at 64 tokens: 0 of" in printed and "passages of <= 20 tokens (maxp)" in printed
    report = json.loads((tmp_path / "passages.json").read_text())
    dense = report["index"]["manifest"]["dense"]
    assert dense["passages"]["count"] > 22 and dense["truncation"]["truncated"] == 0
    run = (tmp_path / "passages-runs" / "long.test.dense.trec").read_text().split("\n")
    ranked = [line.split()[2] for line in run if line.startswith("q1 ")]
    assert len(ranked) == len(set(ranked)) == 22, "documents are scored, each once"
