"""retr from Python: build an index, search it, evaluate pipelines, with the CLI's options and defaults.

    import retr

    index = retr.Index.build("notes.jsonl", "notes.idx")           # as `retr index --corpus notes.jsonl --out notes.idx`
    hits = index.search("how do I rotate the keys", k=5, mode="hybrid").hits
    report = retr.evaluate("scifact", pipelines=("bm25", "dense", "hybrid"))

Errors are ``retr.RetrError`` with the CLI's one-line messages; nothing is printed to stdout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from retr.eval.metrics import DEFAULT_K_VALUES
from retr.eval.report import EvalReport
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.searcher import SearchHit, SearchResult
from retr.retrieval.backends.registry import DEFAULT_BACKEND
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import DEFAULT_FUSION

__all__ = ["DenseIndexConfig", "EvalReport", "Index", "RetrError", "SearchHit", "SearchResult", "evaluate"]


class Index:
    """An index folder opened for search (see ``build`` and ``load``)."""

    def __init__(self, searcher):
        self._searcher = searcher

    @classmethod
    def build(cls, corpus: str | Path, out: str | Path, *, model: str | None = None, backend: str = DEFAULT_BACKEND,
              bm25: bool = True, kind: str = "flat", id_field: str | None = None, text_field: str | None = None,
              title_field: str | None = None, max_length: int | None = None, use_cache: bool = True,
              query_prompt: str | None = None, doc_prompt: str | None = None, passages: str | None = None,
              aggregate: str = "maxp", shards: int = 1, executor: str = "local", ray_address: str | None = None,
              ray_actors: int = 2, **dense_options) -> Index:
        """Build ``out`` from ``corpus`` (a BEIR folder or a JSONL/CSV/TSV file) and open it. The options are
        `retr index`'s (prompts: None takes the model's own; ``passages``: ``"N[:STRIDE]"`` indexes passages and
        ranks documents by their ``aggregate``; ``executor="ray"`` encodes on a Ray cluster); ``dense_options``
        are ``DenseIndexConfig`` fields (``hnsw_m``, ``ef_search``, ...)."""
        from retr.indexes.build import IndexConfig, build_index
        from retr.indexes.corpus import CorpusFormat, load_corpus
        from retr.indexes.executors import ExecutorConfig
        from retr.retrieval.bm25 import BM25Config
        from retr.retrieval.encoder import EncoderConfig
        from retr.retrieval.passages import PassageConfig

        corpus_ = load_corpus(Path(corpus), CorpusFormat(id_field, text_field, title_field))
        try:
            dense = DenseIndexConfig(kind=kind, **dense_options)
        except TypeError as e:
            raise RetrError(f"unknown index option: {e}") from None
        cfg = IndexConfig(dense=dense, encoder=EncoderConfig(model=model, backend=backend, max_length=max_length,
                                                             query_prompt=query_prompt, doc_prompt=doc_prompt),
                          bm25=BM25Config() if bm25 else None, use_cache=use_cache,
                          passages=PassageConfig.parse(passages, aggregate) if passages else None, shards=shards,
                          executor=ExecutorConfig(name=executor, address=ray_address, actors=ray_actors))
        build_index(corpus_, Path(out), cfg)
        return cls.load(out, backend=backend)

    @classmethod
    def load(cls, folder: str | Path, *, model: str | None = None, backend: str = DEFAULT_BACKEND,
             query_backend: str | None = None, fusion: str = DEFAULT_FUSION, query_prompt: str | None = None) -> Index:
        """Open an index folder (checked against its manifest). ``model``: the query encoder (default: the one
        that built the index; ``query_prompt``: the index's unless given, and refused when another)."""
        from retr.eval.pseudo import check_index_reranker
        from retr.indexes.searcher import Searcher
        from retr.retrieval.encoder import EncoderConfig
        from retr.retrieval.pipeline import PipelineConfig

        return cls(Searcher(folder, EncoderConfig(model=model, backend=backend, query_backend=query_backend,
                                                  query_prompt=query_prompt),
                            PipelineConfig(fusion=fusion), checker=check_index_reranker))

    @property
    def ids(self) -> list[str]:
        return list(self._searcher.index.ids)

    @property
    def manifest(self) -> dict:
        return self._searcher.index.manifest

    def search(self, query: str, k: int = 10, mode: str = "hybrid", rerank: str | None = None,
               filter: Mapping[str, object] | None = None) -> SearchResult:
        """The top ``k`` documents for ``query``: ``mode`` bm25, dense or hybrid; ``rerank`` a cross-encoder
        folder; ``filter`` ``{field: value}`` on the corpus records' other fields (every stage restricted).
        The result's ``hits`` are typed (rank, id, score, title, text, metadata); ``latency_ms`` per stage."""
        return self._searcher.search(query, k, mode, rerank, filter)

    def search_batch(self, queries: Sequence[str], k: int = 10, mode: str = "hybrid", rerank: str | None = None,
                     filter: Mapping[str, object] | None = None) -> list[SearchResult]:
        """``search`` for each query, in order (each searched alone: its hits never depend on the others)."""
        return self._searcher.search_many(list(queries), k, mode, rerank, filter)

    def add(self, corpus: str | Path, *, id_field: str | None = None, text_field: str | None = None,
            title_field: str | None = None):
        """Add (or, for ids already held, update) the documents of ``corpus`` without a rebuild, as `retr add`;
        this object then searches the new generation. Returns what changed."""
        from retr.indexes.corpus import CorpusFormat, load_corpus
        from retr.indexes.update import add_documents

        corpus_ = load_corpus(Path(corpus), CorpusFormat(id_field, text_field, title_field))
        return self._changed(add_documents(self._searcher.index.folder, corpus_))

    def delete(self, ids: Sequence[str], *, missing_ok: bool = False):
        """Delete the documents ``ids`` (tombstones until ``compact``), as `retr delete`."""
        from retr.indexes.update import delete_documents

        return self._changed(delete_documents(self._searcher.index.folder, list(ids), missing_ok=missing_ok))

    def compact(self):
        """Fold deleted records away, as `retr compact` (search results do not change)."""
        from retr.indexes.update import compact_index

        return self._changed(compact_index(self._searcher.index.folder))

    def _changed(self, change):
        self._searcher = self._searcher.reopened()
        return change

    def close(self) -> None:
        self._searcher.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate(dataset: str | Path, pipelines: Sequence[str] = ("bm25", "dense", "hybrid"), *, split: str = "test",
             model: str | None = None, backend: str = DEFAULT_BACKEND, query_backend: str | None = None,
             reranker: str | None = None, k_values: Sequence[int] = DEFAULT_K_VALUES, kind: str = "flat",
             fusion: str = DEFAULT_FUSION, warmup: int = 5, download: bool = True, run_dir: str | Path | None = None,
             out: str | Path | None = None, query_prompt: str | None = None,
             doc_prompt: str | None = None, passages: str | None = None, aggregate: str = "maxp") -> EvalReport:
    """`retr eval` from Python: the typed report (written to ``out`` as JSON when given)."""
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.passages import PassageConfig
    from retr.retrieval.pipeline import PipelineConfig, parse_pipelines
    from retr.retrieval.rerank import RerankConfig

    cfg = EvalConfig(pipelines=parse_pipelines(",".join(pipelines)), k_values=tuple(sorted(set(k_values))),
                     encoder=EncoderConfig(model=model, backend=backend, query_backend=query_backend,
                                           query_prompt=query_prompt, doc_prompt=doc_prompt),
                     dense=DenseIndexConfig(kind=kind), pipeline=PipelineConfig(fusion=fusion),
                     reranker=RerankConfig(model=reranker) if reranker else None, warmup=warmup,
                     passages=PassageConfig.parse(passages, aggregate) if passages else None)
    report = run_eval(load_dataset(str(dataset), split, download=download), cfg,
                      Path(run_dir) if run_dir else None)
    if out is not None:
        report.write(Path(out))
    return report
