"""One conformance suite that every retriever goes through, plus checks against references
(numpy brute force for FAISS flat, a hand-written Lucene BM25 for bm25s)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from retr.indexes.build import IndexConfig, build_index
from retr.indexes.corpus import load_corpus
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.folder import IndexFolder
from retr.retrieval.bm25 import BM25Config, tokenize
from retr.retrieval.compose import IndexParts, build
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.pipeline import PipelineConfig, parse
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

from .conftest import QUERIES

KINDS = ("flat", "hnsw", "ivfpq", "lean")


@pytest.fixture(scope="module")
def env(tiny_dataset, tiny_bi_encoder, tiny_cross_encoder, tmp_path_factory):
    corpus = load_corpus(tiny_dataset)
    encoder = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    root = tmp_path_factory.mktemp("indexes")
    indexes = {}
    for kind in KINDS:
        cfg = IndexConfig(dense=DenseIndexConfig(kind=kind, nprobe=64), encoder=EncoderConfig(model=str(tiny_bi_encoder)),
                          bm25=BM25Config())
        build_index(corpus, root / kind, cfg, encoder=encoder)
        indexes[kind] = IndexFolder(root / kind)
    reranker = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), depth=5, max_length=64))
    return corpus, encoder, indexes, reranker


SPECS = [
    ("bm25", "flat", "rrf"),
    ("dense", "flat", "rrf"),
    ("dense", "hnsw", "rrf"),
    ("dense", "ivfpq", "rrf"),
    ("dense", "lean", "rrf"),
    ("hybrid", "flat", "rrf"),
    ("hybrid", "hnsw", "minmax"),
    ("dense+rerank", "flat", "rrf"),
    ("hybrid+rerank", "ivfpq", "rrf"),
    ("bm25+rerank", "flat", "rrf"),
]


def _make(env, name, kind, fusion) -> Retriever:
    corpus, encoder, indexes, reranker = env
    return build(parse(name), IndexParts(indexes[kind], encoder), PipelineConfig(fusion=fusion, fusion_depth=8),
                 reranker)


@pytest.mark.parametrize("name,kind,fusion", SPECS, ids=[f"{a}-{b}-{c}" for a, b, c in SPECS])
def test_retriever_conformance(env, name, kind, fusion):
    corpus = env[0]
    r = _make(env, name, kind, fusion)
    assert isinstance(r, Retriever)
    k = 7
    timer = StageTimer()
    run = r.search(QUERIES, k, timer)
    assert list(run) == list(QUERIES), "one entry per query, in order"
    known = set(corpus.ids)
    for hits in run.values():
        assert len(hits) <= k
        assert len({h.doc_id for h in hits}) == len(hits)
        assert all(h.doc_id in known for h in hits)
        assert all(math.isfinite(h.score) for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    if not name.startswith("bm25"):
        assert all(len(hits) == k for hits in run.values()), "dense-based pipelines always fill k"
    assert set(timer.seconds) == set(r.stages) and all(v >= 0 for v in timer.seconds.values())
    # deterministic, and a single query gets what it gets in a batch
    again = r.search(QUERIES, k)
    assert again.to_dict().keys() == run.to_dict().keys()
    for qid in QUERIES:
        single = r.search({qid: QUERIES[qid]}, k)[qid]
        assert [h.doc_id for h in single] == [h.doc_id for h in run[qid]]
        np.testing.assert_allclose([h.score for h in single], [h.score for h in run[qid]], rtol=1e-4, atol=1e-5)
    assert r.search({}, k) == {} or len(r.search({}, k)) == 0
    assert all(len(h) <= 1 for h in r.search(QUERIES, 1).values())


def test_flat_equals_numpy_brute_force(env):
    corpus, encoder, indexes, _ = env
    emb = encoder.encode([d.full_text() for d in corpus.docs])
    r = _make(env, "dense", "flat", "rrf")
    run = r.search(QUERIES, 5)
    for qid, text in QUERIES.items():
        scores = emb @ encoder.encode_queries([text])[0]  # queries take the query graph
        order = np.argsort(-scores, kind="stable")[:5]
        # exact search: the top-5 scores are the brute-force top-5, and each hit carries its own score
        # (random tiny models give near-ties, so ids are compared through their scores)
        np.testing.assert_allclose([h.score for h in run[qid]], scores[order], rtol=1e-5, atol=1e-6)
        for h in run[qid]:
            assert h.score == pytest.approx(float(scores[corpus.ids.index(h.doc_id)]), rel=1e-5, abs=1e-6)


def _clustered():
    """3,000 clustered 64-d unit vectors, 50 queries near some of them, and each query's exact top 10."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(30, 64))
    emb = centres[rng.integers(0, 30, 3000)] + 0.5 * rng.normal(size=(3000, 64))
    emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
    queries = emb[rng.choice(3000, 50, replace=False)] + 0.1 * rng.normal(size=(50, 64)).astype(np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    exact = np.argsort(-(queries @ emb.T), axis=1)[:, :10]
    return emb, queries, exact


@pytest.mark.parametrize("kind,floor", [("hnsw", 0.99), ("ivfpq", 0.75)])  # measured: 1.0 and 0.85
def test_ann_indexes_against_flat_on_clustered_vectors(kind, floor):
    """Recall@10 against exact search on 3,000 clustered 64-d unit vectors (HNSW near exact; IVF-PQ, lossy by
    design, with every list probed so that only its codes cost recall)."""
    from retr.indexes.dense import build_faiss

    emb, queries, exact = _clustered()
    index, params = build_faiss(emb, DenseIndexConfig(kind=kind, nprobe=10_000, pq_m=32))
    if kind == "ivfpq":
        assert params["nprobe"] == params["nlist"] and params["pq_m"] == 32
    _, got = index.search(queries, 10)
    recall = np.mean([len(set(g) & set(e)) / 10 for g, e in zip(got.tolist(), exact.tolist(), strict=True)])
    assert recall >= floor, f"{kind}: recall@10 {recall:.3f}"
    if kind == "ivfpq":
        assert recall < 0.999, "IVF-PQ's codes are lossy: an exact answer means the index was not compressed"


def test_lean_rescoring_recovers_what_its_codes_lose(tmp_path):
    """The lean kind on 3,000 clustered vectors, every list probed: its 4-bit codes alone (k_factor 1) lose
    recall; re-scored from the fp16 vectors (k_factor 80, the default) it is near exact. Saved and loaded, the fp16 part is
    memory-mapped (its file appears in this process's mappings) and answers the same."""
    import os

    from retr.indexes.dense import build_faiss, configure_search, load_faiss, save_dense

    emb, queries, exact = _clustered()

    def recall(got):
        return np.mean([len(set(g) & set(e)) / 10 for g, e in zip(got.tolist(), exact.tolist(), strict=True)])

    index, params = build_faiss(emb, DenseIndexConfig(kind="lean", lean_m=16, lean_nprobe=10_000))
    assert params["nprobe"] == params["nlist"] and params["k_factor"] == 80 and params["refine"] == "fp16"
    _, rescored = index.search(queries, 10)
    configure_search(index, "lean", {**params, "k_factor": 1})
    codes_only = recall(index.search(queries, 10)[1])
    assert recall(rescored) >= 0.99 and codes_only < 0.9, (recall(rescored), codes_only)
    configure_search(index, "lean", params)
    saved = save_dense(index, emb, "lean", tmp_path)
    # in RAM: 8 bytes of code + 8 of id a vector, plus centroids and fast-scan padding; on disk: 2 bytes a dim
    assert saved["resident_bytes"] < 3000 * 64 and saved["bytes"] - saved["resident_bytes"] >= 3000 * 64 * 2
    loaded = load_faiss(tmp_path, {"kind": "lean", **saved})
    configure_search(loaded, "lean", params)
    with open(f"/proc/{os.getpid()}/maps") as maps:
        assert str(tmp_path / saved["refine_file"]) in maps.read()
    np.testing.assert_array_equal(loaded.search(queries, 10)[1], rescored)


def _lucene_bm25(corpus, query, k1=1.5, b=0.75):
    cfg = BM25Config()
    docs = tokenize([d.full_text() for d in corpus.docs], cfg)
    q = tokenize([query], cfg)[0]
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    scores = {}
    for doc, toks in zip(corpus.ids, docs, strict=True):
        s = 0.0
        for t in set(q):
            df = sum(1 for d in docs if t in d)
            tf = toks.count(t)
            if tf == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            s += idf * tf / (tf + k1 * (1 - b + b * len(toks) / avgdl))  # Lucene >= 8: no (k1 + 1)
        if s > 0:
            scores[doc] = s
    return scores


def test_bm25_equals_hand_computed_lucene_bm25(env):
    corpus = env[0]
    run = _make(env, "bm25", "flat", "rrf").search(QUERIES, 16)
    for qid, text in QUERIES.items():
        ref = _lucene_bm25(corpus, text)
        got = {h.doc_id: h.score for h in run[qid]}
        assert got.keys() == ref.keys(), qid
        for d in ref:
            assert got[d] == pytest.approx(ref[d], rel=1e-5)
    assert run["q6"] == ()  # no known term: no hits
    assert re.fullmatch(r"\w+", tokenize(["Running"], BM25Config())[0][0])


def test_rank_bm25_agrees_on_top_documents(env):
    """rank_bm25 (the peer) uses another idf, so compare what matters: the top document."""
    from rank_bm25 import BM25Okapi

    corpus = env[0]
    cfg = BM25Config()
    peer = BM25Okapi(tokenize([d.full_text() for d in corpus.docs], cfg), k1=1.5, b=0.75)
    run = _make(env, "bm25", "flat", "rrf").search(QUERIES, 1)
    for qid in ("q1", "q3", "q4", "q5"):
        scores = peer.get_scores(tokenize([QUERIES[qid]], cfg)[0])
        assert run[qid][0].doc_id == corpus.ids[int(np.argmax(scores))]


def test_fusion_functions_by_hand():
    from retr.retrieval.fusion import minmax, rrf, zscore
    from retr.retrieval.types import Run

    a = Run({"q": [("x", 3.0), ("y", 2.0), ("z", 1.0)]})
    b = Run({"q": [("y", 10.0), ("w", 5.0)]})
    fused = rrf([a, b], 10, rrf_k=60)["q"]
    assert fused[0].doc_id == "y" and fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert [h.doc_id for h in fused[1:]] == ["x", "w", "z"]
    mm = minmax([a, b], 10, [0.5, 0.5])["q"]
    assert {h.doc_id: round(h.score, 6) for h in mm} == {"y": 0.75, "x": 0.5, "w": 0.0, "z": 0.0}
    # depth 2: min and max from each list's top 2 (x: 1.0, y: 0 from a; y: 1.0, w: 0 from b); z is in no head: it
    # follows, by its unclipped value (a: (1 - 2) / (3 - 2) = -1; b missed it: b's deepest value, 0)
    mm2 = minmax([a, b], 10, [0.5, 0.5], depth=2)["q"]
    assert {h.doc_id: round(h.score, 6) for h in mm2} == {"y": 0.5, "x": 0.5, "w": 0.0, "z": -0.5}
    z = zscore([a, b], 10, [0.5, 0.5])["q"]
    za = {"x": 1.224745, "y": 0.0, "z": -1.224745}  # (s - 2) / sqrt(2/3)
    zb = {"y": 1.0, "w": -1.0}
    want = {d: 0.5 * za.get(d, -1.224745) + 0.5 * zb.get(d, -1.0) for d in "xyzw"}
    assert {h.doc_id: round(h.score, 5) for h in z} == {d: round(v, 5) for d, v in want.items()}


@pytest.mark.parametrize("fusion", ["minmax", "zscore"])
def test_the_head_of_a_score_fusion_does_not_depend_on_how_deep_the_lists_go(fusion):
    """A search for 10 fuses lists 100 deep; an eval for 1000 fuses them 1000 deep: their top 10 must agree."""
    from retr.retrieval.fusion import FUSIONS
    from retr.retrieval.types import Run

    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(2000)]
    for _ in range(20):
        a = Run({"q": sorted(zip(rng.choice(docs, 1000, replace=False).tolist(), np.sort(rng.random(1000))[::-1]
                                 .tolist(), strict=True), key=lambda x: -x[1])})
        b = Run({"q": sorted(zip(rng.choice(docs, 1000, replace=False).tolist(), (rng.random(1000) * 30).tolist(),
                                 strict=True), key=lambda x: -x[1])})
        shallow = FUSIONS[fusion]([a.top(100), b.top(100)], 10, 60, None, 100)["q"]
        deep = FUSIONS[fusion]([a, b], 1000, 60, None, 100)["q"][:10]
        assert [(h.doc_id, round(h.score, 9)) for h in shallow] == [(h.doc_id, round(h.score, 9)) for h in deep]


def _fused_one_document_at_a_time(runs, k, weights, depth, normaliser):
    """``_score_fusion``'s definition, written as its docstring says (the reference the array version must equal)."""
    from retr.retrieval.types import Hit, Run, trec_sorted

    out = {}
    for q in dict.fromkeys(q for run in runs for q in run):
        parts = []
        for run, w in zip(runs, weights, strict=True):
            hits = run.get(q, ())
            if hits:
                n = min(len(hits), depth) if depth else len(hits)
                f = normaliser([h.score for h in hits[:n]])
                parts.append((w, {h.doc_id: f(h.score) for h in hits}, {h.doc_id for h in hits[:n]},
                              f(hits[n - 1].score), f(hits[-1].score)))
        scores = {}
        for d in dict.fromkeys(d for _, values, _, _, _ in parts for d in values):
            if any(d in head for _, _, head, _, _ in parts):
                scores[d] = sum(w * max(floor, values.get(d, floor)) for w, values, _, floor, _ in parts)
            else:
                scores[d] = sum(w * values.get(d, deepest) for w, values, _, _, deepest in parts)
        out[q] = trec_sorted(Hit(d, s) for d, s in scores.items())[:k]
    return Run(out)


@pytest.mark.parametrize("fusion", ["minmax", "zscore"])
def test_a_score_fusion_gives_exactly_the_scores_of_its_per_document_definition(fusion):
    """Ties, flat lists, empty lists, missing queries, weights and depths: the same hits and the same floats."""
    from retr.retrieval import fusion as fusions
    from retr.retrieval.types import Run

    normaliser = {"minmax": fusions._minmax_of, "zscore": fusions._zscore_of}[fusion]
    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(300)]
    for trial in range(30):
        runs = []
        for r in range(int(rng.integers(1, 4))):
            lists = {}
            for q in ("q1", "q2", "q3"):
                n = int(rng.integers(0, 200)) if (trial + r) % 5 else 0
                scores = np.round(rng.normal(size=n), 1 if trial % 2 else 6)  # coarse: many ties
                if trial % 7 == 3:
                    scores[:] = 0.5  # a flat list
                lists[q] = list(zip(rng.choice(docs, n, replace=False).tolist(), scores.tolist(), strict=True))
            if trial % 4 == 1:
                lists.pop("q3")
            runs.append(Run(lists))
        weights = rng.dirichlet(np.ones(len(runs))).tolist() if trial % 3 else [1.0 / len(runs)] * len(runs)
        depth = [None, 5, 50, 1000][trial % 4]
        k = [10, 1000][trial % 2]
        got = fusions._score_fusion(runs, k, weights, depth, normaliser)
        want = _fused_one_document_at_a_time(runs, k, weights, depth, normaliser)
        assert list(got) == list(want)
        for q in want:
            assert [(h.doc_id, h.score) for h in got[q]] == [(h.doc_id, h.score) for h in want[q]], (trial, q)


def test_rerank_reorders_only_the_head(env):
    corpus, encoder, indexes, reranker = env
    first = _make(env, "dense", "flat", "rrf").search(QUERIES, 10)
    rr = _make(env, "dense+rerank", "flat", "rrf").search(QUERIES, 10)
    for qid in QUERIES:
        head = {h.doc_id for h in first[qid][:5]}
        assert {h.doc_id for h in rr[qid][:5]} == head
        assert [h.doc_id for h in rr[qid][5:]] == [h.doc_id for h in first[qid][5:]]
        texts = [corpus.docs[corpus.ids.index(h.doc_id)].full_text() for h in rr[qid][:5]]
        np.testing.assert_allclose(reranker.score(QUERIES[qid], texts), [h.score for h in rr[qid][:5]], rtol=1e-4)


def test_reranker_folder_must_be_a_cross_encoder(tiny_bi_encoder, tmp_path):
    from retr.retrieval.errors import RetrError

    with pytest.raises(RetrError, match="not a cross-encoder"):
        CrossEncoderReranker(RerankConfig(model=str(tiny_bi_encoder)))
    with pytest.raises(RetrError, match="no such cross-encoder folder"):
        CrossEncoderReranker(RerankConfig(model=str(tmp_path / "nope")))


def test_fast_query_tokenisation_equals_bm25s(env):
    corpus, _, indexes, _ = env
    r = IndexParts(indexes["flat"]).bm25()
    texts = [*QUERIES.values(), *(d.full_text() for d in corpus.docs), "The RUNNING runners ran; it's 2024!"]
    ref = tokenize(texts, BM25Config())
    for text, ref_tokens in zip(texts, ref, strict=True):
        expected = [r.vocab[t] for t in ref_tokens if t in r.vocab]
        assert r._query_ids(text) == expected, text


def test_interpolation_by_hand():
    from retr.retrieval.rerank import interpolate

    ce = np.array([2.0, 0.0, 1.0], dtype=np.float32)
    fs = np.array([0.3, 0.5, 0.1], dtype=np.float32)
    np.testing.assert_allclose(interpolate(ce, fs, 1.0), ce)
    np.testing.assert_allclose(interpolate(ce, fs, 0.0), [0.5, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(interpolate(ce, fs, 0.5), [0.75, 0.5, 0.25], rtol=1e-6)
