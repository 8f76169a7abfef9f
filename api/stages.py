"""Pipelines composed in Python: the values `retr search --mode` and `retr eval --mode` parse their text into.

    from retr.stages import BM25, RM3, Dense, Fuse, Rerank

    p = Fuse(BM25(), BM25() >> RM3(), Dense()) >> Rerank()
    str(p)                                    # 'fuse(bm25,bm25+rm3,dense)+rerank'
    index.search("query", mode=p, rerank="ce/")
    retr.evaluate("scifact", mode=[BM25(), BM25() >> RM3(fb_docs=5), "hybrid"])

``a >> step`` applies a step (``RM3()``, ``Rerank()``) to pipeline ``a``; ``a % n`` keeps its top ``n``;
``Fuse(a, b, ...)`` fuses any number of lists. ``parse(text)`` reads the text form; a value equals the value
parsed from its ``str``.
"""

from __future__ import annotations

from retr.retrieval.pipeline import Pipeline, parse

__all__ = ["BM25", "RM3", "Dense", "Fuse", "Hybrid", "MaxSim", "Pipeline", "Rerank", "Splade", "parse", "stage"]


def stage(name: str, *inputs: Pipeline | str, **options) -> Pipeline:
    """Any registered stage by name (``retr.retrieval.stages``): a first stage or fusion with its ``inputs``, a
    step pending until ``>>`` applies it."""
    return Pipeline(name, [parse(p) for p in inputs], options)


def BM25() -> Pipeline:
    """BM25 over the index's BM25 part."""
    return Pipeline("bm25")


def Dense() -> Pipeline:
    """The bi-encoder's query vector searched in the index's FAISS part."""
    return Pipeline("dense")


def Splade() -> Pipeline:
    """The learned sparse encoder's query vector against the index's sparse part (``retr index --sparse-model``);
    ``Fuse(BM25(), Dense(), Splade())`` is ``hybrid3``."""
    return Pipeline("splade")


def Hybrid() -> Pipeline:
    """``Fuse(BM25(), Dense())``: the default pipeline."""
    return parse("hybrid")


def Fuse(*pipelines: Pipeline | str, method: str | None = None) -> Pipeline:
    """The fusion of two or more pipelines' lists (``method``: minmax, zscore or rrf; None: the searcher's)."""
    return stage("fuse", *pipelines, **({"method": method} if method else {}))


def Rerank() -> Pipeline:
    """The cross-encoder step (the model: ``rerank=`` of the search, ``--rerank`` of the command)."""
    return Pipeline("rerank")


def MaxSim(depth: int = 100, weight: float = 1.0) -> Pipeline:
    """Late interaction: the multi-vector encoder (``multivector_model``) rescores the top ``depth`` by MaxSim;
    ``weight`` < 1 mixes in the first stage's scores (min-max scaled, as the cross-encoder's weight does)."""
    return Pipeline("maxsim", (), {"depth": depth, "weight": weight})


def RM3(fb_terms: int = 10, fb_docs: int = 10, original_query_weight: float = 0.5) -> Pipeline:
    """RM3 pseudo-relevance feedback: the query expanded from the top ``fb_docs`` of the pipeline before it, then
    searched with BM25 (Pyserini's and PyTerrier's defaults)."""
    return Pipeline("rm3", (), {"fb_terms": fb_terms, "fb_docs": fb_docs,
                                "original_query_weight": original_query_weight})
