"""A cross-encoder checked on a corpus it was not trained on, without judged queries.

A reranker trained on one collection can lose nDCG on another (README, "Reranking on other collections"), and
the weight chosen on its own dev queries says nothing about that. The corpus check measures it on the corpus
itself: a span of 6-14 words is cut out of each of up to ``PSEUDO_QUERIES`` documents (seeded) and becomes a
query whose one relevant document is what is left of that document (the inverse cloze task). The corpus with
those documents shortened is indexed like the real one (the other documents' vectors reused), its first stage
retrieves each pseudo-query's top ``depth``, and the cross-encoder rescores them at every interpolation weight
0, 0.1 .. 1. The weight the curve picks (``smoothed_best``) caps the trained one on that corpus
(``CrossEncoderReranker.weight_for``); where it is 0 the reranker is turned down there and costs nothing.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from retr.eval.metrics import evaluate
from retr.indexes.build import IndexConfig, build_index, corpus_embeddings
from retr.indexes.cache import EmbeddingCache, embedding_key
from retr.indexes.corpus import Corpus
from retr.indexes.dense import live_vectors
from retr.indexes.searcher import Searcher
from retr.indexes.shards import open_index
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.encoder import BiEncoder
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import PipelineConfig, parse
from retr.retrieval.progress import Progress
from retr.retrieval.rerank import (
    CHECK_SEED,
    MIN_PSEUDO_QUERIES,
    PSEUDO_QUERIES,
    CorpusCheck,
    CrossEncoderReranker,
    checked_weight,
    rerank_head,
    smoothed_best,
)
from retr.retrieval.rerank_check import beside_path, keeps_checks
from retr.retrieval.types import Document, Qrels, Run

logger = logging.getLogger(__name__)

SPAN_WORDS = (6, 14)  # a pseudo-query's length in words, drawn uniformly; a document must hold twice as many


@dataclass(frozen=True)
class PseudoQuery:
    position: int  # of its document in the corpus
    query: str  # the span cut out
    rest: str  # the document's text without it


def cut_queries(docs: list[Document], n: int, seed: int, span: tuple[int, int] = SPAN_WORDS) -> list[PseudoQuery]:
    """Up to ``n`` pseudo-queries, one per document, from documents (in a seeded order) whose text holds at least
    twice the span's words."""
    rng = np.random.default_rng(seed)
    out: list[PseudoQuery] = []
    for i in rng.permutation(len(docs)):
        words = docs[i].text.split()
        size = int(rng.integers(span[0], span[1] + 1))
        if len(words) < 2 * size:
            continue
        start = int(rng.integers(0, len(words) - size + 1))
        out.append(PseudoQuery(int(i), " ".join(words[start:start + size]),
                               " ".join(words[:start] + words[start + size:])))
        if len(out) == n:
            break
    return out


def shortened(corpus: Corpus, cut: list[PseudoQuery], where: Path) -> Corpus:
    """``corpus`` with each cut document replaced by what is left of it (in memory; its checksum names the cut)."""
    rest = {c.position: c.rest for c in cut}
    docs = [replace(d, text=rest[i]) if i in rest else d for i, d in enumerate(corpus.docs)]
    digest = hashlib.sha256(f"{corpus.sha256}|pseudo|{[(c.position, c.query) for c in cut]}".encode()).hexdigest()
    return Corpus(docs=docs, source=where / "pseudo-corpus.jsonl", sha256=digest)


def check_index_reranker(index, encoder: BiEncoder, reranker: CrossEncoderReranker,
                         pipeline: PipelineConfig | None = None, corpus: Corpus | None = None,
                         strict: bool = False) -> CorpusCheck | None:
    """``check_reranker`` on an index folder's own documents (its doc store): what `retr check-reranker`,
    `retr index --rerank`, `retr serve` and `retr eval` run the first time a cross-encoder trained on another corpus
    meets the index. The check stored beside the index (``<index>/rerank-checks/<key>.json``) is read first, then
    one adopted or in the cache, and only then is one measured; a check not read from beside the index is stored
    there, so that a copy of the index keeps it. An index in retr's own cache (`retr eval --dataset`) keeps its
    checks in the cache alone (``keeps_checks``). ``strict``: a check that cannot be stored beside the index is an
    error (`retr check-reranker`); else a warning (the cache holds it). The vectors of the unchanged documents are
    the ones the index holds (one per document: flat, HNSW, the lean index's kept ones), else the embedding cache's
    (encoded once and cached where absent). ``corpus``: the index's corpus where the caller holds it already
    (`retr eval --dataset`), in the index's order."""
    sha256, folder = index.manifest.corpus.sha256, Path(index.folder)
    key = reranker.check_key(sha256, encoder.model_hash)
    beside = keeps_checks(folder)
    if beside:
        stored = CorpusCheck.load_beside(folder, key, sha256, reranker.model_hash, encoder.model_hash)
        if stored is not None:
            logger.info("reranker check stored beside the index used: weight %.1f on this corpus", stored.weight)
            reranker.adopt(stored)
            return stored
    check = reranker.find_check(sha256, encoder.model_hash)  # adopted, or in the cache
    if check is None:
        if corpus is None or corpus.sha256 != sha256 or corpus.ids != list(index.ids):
            docs = [index.docstore.get(i) for i in range(len(index.ids))]
            corpus = Corpus(docs=docs, source=folder / "docstore", sha256=sha256)
        vectors = None
        info = index.dense_info
        if getattr(index, "shards", None) is None and not info.get("passages"):  # one vector per document, in order
            held = live_vectors(Path(index.parts), info, index.faiss_index)
            if held.shape == (len(corpus.docs), encoder.dim):
                vectors = (held, (info.get("encode") or {}).get("graph"))
        check = check_reranker(corpus, encoder, reranker, pipeline, vectors=vectors)
    if check is not None and beside:
        _store_beside(check, folder, key, strict)
    return check


def _store_beside(check: CorpusCheck, folder: Path, key: str, strict: bool) -> None:
    """``check`` stored beside the index ``folder``; where it cannot be (a read-only folder, a symlinked checks
    folder): an error when ``strict``, else a warning."""
    try:
        path = check.save_beside(folder, key)
    except (OSError, RetrError) as e:
        why = e if isinstance(e, RetrError) else f"{beside_path(folder, key).parent}: {e.strerror or e}"
        if strict:
            raise RetrError(f"the reranker check could not be stored beside the index: {why}") from None
        logger.warning("reranker check not stored beside the index (%s): the cache holds it", why)
        return
    logger.info("reranker check stored beside the index: %s", path)


@dataclass(frozen=True)
class PseudoRun:
    """Pseudo-queries, their one relevant document each, and the first stage's ranking of the shortened corpus."""

    queries: dict[str, str]
    qrels: Qrels
    first: Run  # each query's top max(10, depth)
    texts: dict[str, str]  # what the cross-encoder reads of each document of the shortened corpus

    def curve(self, reranker: CrossEncoderReranker, depth: int) -> dict[str, float]:
        """nDCG@10 with ``reranker`` rescoring each query's top ``depth`` at every weight 0, 0.1 .. 1."""
        return self.measure(reranker, depth)[0]

    def measure(self, reranker: CrossEncoderReranker, depth: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """``curve``, and at every weight each pseudo-query's nDCG@10 (in query order) it is the mean of."""
        ce = {}
        with Progress(len(self.queries), "reranker check", unit="q") as bar:
            for q in self.queries:
                ce[q] = reranker.score(self.queries[q], [self.texts[h.doc_id] for h in self.first[q][:depth]])
                bar.update(1)
        curve, per_query = {}, {}
        for w in range(11):
            run = {q: rerank_head(self.first[q][:depth], self.first[q][depth:], ce[q], w / 10) for q in self.queries}
            result = evaluate(Run(run), self.qrels, [10])
            curve[f"{w / 10:.1f}"] = result.mean["NDCG@10"]
            per_query[f"{w / 10:.1f}"] = np.array([result.per_query[q]["NDCG@10"] for q in self.queries])
        return curve, per_query


def gain_bounds(per_query: dict[str, np.ndarray], seed: int = CHECK_SEED) -> dict[str, float]:
    """Per weight above 0: the lower end of the 95% paired bootstrap interval (``RESAMPLES`` seeded resamples of the
    pseudo-queries) of the mean nDCG@10 gain over the first stage alone (weight 0)."""
    from retr.eval.stats import RESAMPLES, bootstrap_ci

    base = per_query["0.0"]
    return {w: bootstrap_ci(base, v, np.mean, RESAMPLES, seed)[1] for w, v in per_query.items() if w != "0.0"}


def _cached_vectors(encoder: BiEncoder, corpus: Corpus) -> tuple[np.ndarray, dict | None]:
    """The corpus's document vectors from the embedding cache (encoded and cached where absent), and their graph."""
    base, info = corpus_embeddings(encoder, corpus)
    return base, info.get("graph")


def pseudo_run(corpus: Corpus, encoder: BiEncoder, cut: list[PseudoQuery], fetch: int,
               pipeline: PipelineConfig | None = None, first_stage: str = "hybrid",
               vectors: tuple[np.ndarray, dict | None] | None = None) -> PseudoRun:
    """``corpus`` with the ``cut`` documents shortened, indexed in a temporary folder (flat dense + BM25, default
    options; the other documents' ``vectors``, with the graph that encoded them, reused: default the embedding
    cache's), and ``first_stage``'s top ``fetch`` for each pseudo-query."""
    base, graph = vectors or _cached_vectors(encoder, corpus)
    with tempfile.TemporaryDirectory(prefix="retr-check-") as tmp:
        where = Path(tmp)
        short = shortened(corpus, cut, where)
        spliced = np.array(base, dtype=np.float32)
        rows = [c.position for c in cut]
        texts = [short.docs[i].full_text() for i in rows]
        spliced[rows] = encoder.encode_like(texts, graph) if graph else encoder.encode(texts)
        cache = EmbeddingCache(where / "cache")
        cache.save(embedding_key(encoder.model_hash, short.sha256, encoder.max_length,
                                 encoder.planner.graph_id([d.full_text() for d in short.docs]), encoder.prompts.document), spliced,
                   {"graph": graph})
        build_index(short, where / "index", IndexConfig(encoder=encoder.config, bm25=BM25Config()), encoder=encoder,
                    cache=cache)
        searcher = Searcher(open_index(where / "index"), pipeline=pipeline or PipelineConfig(), query_encoder=encoder)
        queries = {f"p{j}": c.query for j, c in enumerate(cut)}
        first = searcher.retriever(parse(first_stage)).search(queries, fetch)
        searcher.close()
    qrels = Qrels({q: {short.docs[c.position].doc_id: 1} for q, c in zip(queries, cut, strict=True)})
    return PseudoRun(queries, qrels, first, {d.doc_id: d.full_text() for d in short.docs})


def check_reranker(corpus: Corpus, encoder: BiEncoder, reranker: CrossEncoderReranker,
                   pipeline: PipelineConfig | None = None, first_stage: str = "hybrid",
                   vectors: tuple[np.ndarray, dict | None] | None = None) -> CorpusCheck | None:
    """``reranker`` measured on ``corpus``'s pseudo-queries (cached per corpus, reranker, first-stage model, depth
    and length; adopted by ``reranker``); None where the corpus has fewer than ``MIN_PSEUDO_QUERIES`` documents
    long enough to cut one from. ``vectors``: as ``pseudo_run`` takes them."""
    found = reranker.find_check(corpus.sha256, encoder.model_hash)
    if found is not None:
        logger.info("reranker check used: weight %.1f on this corpus", found.weight)
        return found
    cut = cut_queries(corpus.docs, PSEUDO_QUERIES, CHECK_SEED)
    if len(cut) < MIN_PSEUDO_QUERIES:
        logger.warning("corpus too short to check the reranker on (%d documents of %d+ words, %d needed): its "
                       "trained weight stays", len(cut), 2 * SPAN_WORDS[0], MIN_PSEUDO_QUERIES)
        return None
    t0 = time.perf_counter()
    depth = reranker.config.depth
    logger.info("checking reranker %s on this corpus: %d pseudo-queries, %s top %d", reranker.path, len(cut),
                first_stage, depth)
    curve, per_query = pseudo_run(corpus, encoder, cut, max(10, depth), pipeline, first_stage,
                                  vectors).measure(reranker, depth)
    bounds = gain_bounds(per_query)
    best = smoothed_best(curve)
    weight = checked_weight(curve, bounds)
    check = CorpusCheck(corpus_sha256=corpus.sha256, reranker_hash=reranker.model_hash, first_stage=first_stage,
                        first_stage_model=encoder.model_hash, depth=depth, max_length=reranker.max_length,
                        inputs=reranker.inputs,
                        queries=len(cut), seed=CHECK_SEED, weight=weight, curve=curve,
                        first_stage_ndcg=curve["0.0"], seconds=time.perf_counter() - t0, gain_low=bounds)
    check.save(reranker.check_key(corpus.sha256, encoder.model_hash))
    reranker.adopt(check)
    if best != "0.0":
        logger.info("reranker check: nDCG@10 on %d pseudo-queries %.4f (first stage) -> %.4f at weight %s (gain "
                    "%+.4f, 95%% bootstrap lower bound %+.4f): weight %.1f %s (%.0f s)", len(cut), curve["0.0"],
                    curve[best], best, curve[best] - curve["0.0"], bounds[best], weight,
                    "taken" if weight > 0 else "not taken: the gain is not reliable", check.seconds)
    else:
        logger.info("reranker check: nDCG@10 on %d pseudo-queries %.4f (first stage); no weight gains: weight 0 "
                    "(%.0f s)", len(cut), curve["0.0"], check.seconds)
    return check
