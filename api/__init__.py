"""retr from Python: build an index, search it, evaluate pipelines, with the CLI's options and defaults.

    import retr

    index = retr.Index.build("notes.jsonl", "notes.idx")           # as `retr index --corpus notes.jsonl --out notes.idx`
    hits = index.search("how do I rotate the keys", k=5, mode="hybrid").hits
    report = retr.evaluate("scifact", modes=("bm25", "dense", "hybrid"))

Errors are ``retr.RetrError`` with the CLI's one-line messages; nothing is printed to stdout.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError
from retr.retrieval.options import checked, with_options
from retr.retrieval.types import (
    check_choice,
    check_flag,
    check_int,
    check_names,
    check_path,
    check_text,
    shown,
)

if TYPE_CHECKING:  # the names below are loaded when first used (``__getattr__``): `import retr` stays light
    from retr.eval.report import EvalReport
    from retr.indexes.build import IndexConfig
    from retr.indexes.dense import DenseIndexConfig
    from retr.indexes.manifest import IndexManifest
    from retr.indexes.searcher import SearchHit, SearchResult
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.passages import PassageConfig
    from retr.retrieval.request import SearchRequest

__all__ = ["DenseIndexConfig", "EvalReport", "Index", "RetrError", "SearchHit", "SearchRequest", "SearchResult",
           "evaluate"]

_LAZY = {"DenseIndexConfig": "retr.indexes.dense", "EvalReport": "retr.eval.report",
         "SearchHit": "retr.indexes.searcher", "SearchRequest": "retr.retrieval.request",
         "SearchResult": "retr.indexes.searcher"}


def __getattr__(name: str):
    """The API's types, imported from their modules the first time one is asked for (``retr.SearchRequest``)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'retr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


# every default below is the one its config owns (retr.retrieval.defaults says which; tests/test_api.py checks them)
_DEFAULT_PIPELINES = defaults.PIPELINES
def _renamed(**older):
    """Accept each older name of an option (``older``: old -> new; the CLI's names are the API's) as its new one,
    with a ``FutureWarning``; a ``RetrError`` where both are given (positionally or by keyword)."""

    def wrap(fn):
        import functools

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in older.items():
                if old not in kwargs:
                    continue
                value = kwargs.pop(old)
                import inspect

                try:
                    given = new in inspect.signature(fn).bind_partial(*args, **kwargs).arguments
                except TypeError:  # other arguments wrong: the call itself says so
                    given = False
                if given:
                    raise RetrError(f"{old} is the older name of {new}: give one of them")
                import warnings

                warnings.warn(f"{old}= is the older name of {new}=: use {new}", FutureWarning, stacklevel=2)
                kwargs[new] = value
            return fn(*args, **kwargs)

        return call

    return wrap


def _passages(passages: object, aggregate: object) -> PassageConfig | None:
    from retr.retrieval.passages import AGGREGATES, PassageConfig

    aggregate = check_choice(aggregate, "passage_aggregate", AGGREGATES)
    if passages is None:
        return None
    if not isinstance(passages, str):
        raise RetrError(f"passages must be a str 'N' or 'N:STRIDE' (tokens, e.g. '256:128') or None, "
                        f"got {shown(passages)}")
    return PassageConfig.parse(passages, aggregate)


def _encoder(model: object, backend: object, query_backend: object = None, max_length: object = None,
             query_prompt: object = None, doc_prompt: object = None) -> EncoderConfig:
    from retr.retrieval.backends.registry import choices
    from retr.retrieval.encoder import EncoderConfig

    return EncoderConfig(
        model=check_text(model, "model"), backend=check_choice(backend, "backend", choices()),
        query_backend=check_choice(query_backend, "query_backend", choices(), optional=True),
        max_length=None if max_length is None else check_int(max_length, "max_length", 1, 1 << 20),
        query_prompt=check_text(query_prompt, "query_prompt"), doc_prompt=check_text(doc_prompt, "doc_prompt"))


class Index:
    """An index folder opened for search (see ``build`` and ``load``). Once closed (``close``, or the end of a
    ``with`` block), it refuses every call with a one-line error."""

    def __init__(self, searcher):
        self._searcher = searcher
        self._temp: Path | None = None  # from_documents without out: the folder removed on close

    @classmethod
    @_renamed(aggregate="passage_aggregate")
    def build(cls, corpus: str | Path, out: str | Path, *, model: str | None = None,
              backend: str = defaults.BACKEND, bm25: bool = True, kind: str = defaults.DENSE_KIND,
              id_field: str | None = None, text_field: str | None = None, title_field: str | None = None,
              max_length: int | None = None, use_cache: bool = defaults.USE_CACHE,
              query_prompt: str | None = None, doc_prompt: str | None = None, passages: str | None = None,
              passage_aggregate: str = defaults.AGGREGATE, shards: int = defaults.SHARDS,
              executor: str = defaults.EXECUTOR, ray_address: str | None = None,
              ray_actors: int = defaults.RAY_ACTORS, sparse_model: str | None = None, **dense_options) -> Index:
        """Build ``out`` from ``corpus`` (a BEIR folder or a JSONL/CSV/TSV file) and open it. The options are
        `retr index`'s (prompts: None takes the model's own; ``passages``: ``"N[:STRIDE]"`` indexes passages and
        ranks documents by their ``passage_aggregate``; ``executor="ray"`` encodes on a Ray cluster);
        ``dense_options`` are ``DenseIndexConfig`` fields (``hnsw_m``, ``ef_search``, ...), each bounded by the
        config; ``sparse_model``: a SparseEncoder for the learned sparse part (the ``splade`` and ``hybrid3`` modes).
        ``aggregate``: the older name of ``passage_aggregate`` (a ``FutureWarning``)."""
        from dataclasses import replace

        from retr.indexes.build import build_index
        from retr.indexes.corpus import CorpusFormat, load_corpus

        corpus_path, out_path = check_path(corpus, "corpus"), check_path(out, "out")
        cfg = _index_config(model, backend, bm25, kind, max_length, use_cache, query_prompt, doc_prompt, passages,
                            passage_aggregate, shards, executor, ray_address, ray_actors, dense_options)
        cfg = replace(cfg, sparse=_sparse(sparse_model))
        fmt = CorpusFormat(check_text(id_field, "id_field"), check_text(text_field, "text_field"),
                           check_text(title_field, "title_field"))
        build_index(load_corpus(corpus_path, fmt), out_path, cfg)
        return cls.load(out_path, backend=backend)

    @classmethod
    @_renamed(aggregate="passage_aggregate")
    def from_documents(cls, docs: Iterable[str | Mapping], out: str | Path | None = None, *,
                       model: str | None = None, backend: str = defaults.BACKEND, bm25: object = True,
                       kind: str = defaults.DENSE_KIND, max_length: int | None = None,
                       use_cache: bool = defaults.USE_CACHE, query_prompt: str | None = None,
                       doc_prompt: str | None = None, passages: str | None = None,
                       passage_aggregate: str = defaults.AGGREGATE, shards: int = defaults.SHARDS,
                       **dense_options) -> Index:
        """An index of documents held in memory: strings (ids "0", "1", ... by position) or dicts with ``text``
        and optionally ``id`` (or ``_id``/``doc_id``), ``title`` and any other fields (metadata, usable in
        ``filter``). ``out``: the folder to write (the one `retr index` writes); None: a temporary folder,
        removed when the index is closed. The other options are ``build``'s."""
        import shutil
        import tempfile

        from retr.indexes.build import build_index
        from retr.indexes.corpus import corpus_of, documents_of

        out_path = check_path(out, "out", optional=True)
        cfg = _index_config(model, backend, bm25, kind, max_length, use_cache, query_prompt, doc_prompt, passages,
                            passage_aggregate, shards, "local", None, defaults.RAY_ACTORS, dense_options)
        corpus = corpus_of(documents_of(docs), Path("<documents>"))
        temp = Path(tempfile.mkdtemp(prefix="retr-index-")) if out_path is None else None
        try:
            folder = out_path if temp is None else temp / "index"
            build_index(corpus, folder, cfg)
            index = cls.load(folder, backend=backend)
        except BaseException:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise
        index._temp = temp
        return index

    @classmethod
    def load(cls, folder: str | Path, *, model: str | None = None, backend: str = defaults.BACKEND,
             query_backend: str | None = None, fusion: str = defaults.FUSION,
             fusion_depth: int = defaults.FUSION_DEPTH, query_prompt: str | None = None,
             multivector_model: str | None = None) -> Index:
        """Open an index folder (checked against its manifest). ``model``: the query encoder (default: the one
        that built the index; ``query_prompt``: the index's unless given, and refused when another); ``fusion``,
        ``fusion_depth``: the hybrid's, unless a search gives its own; ``multivector_model``: the
        ``MultiVectorEncoder`` of a ``+maxsim`` stage."""
        from retr.indexes.searcher import Searcher
        from retr.retrieval.pipeline import PipelineConfig

        folder = check_path(folder, "folder")
        encoder = _encoder(model, backend, query_backend, query_prompt=query_prompt)
        pipeline = PipelineConfig(**checked(fusion=fusion, fusion_depth=fusion_depth),
                                  multivector_model=check_text(multivector_model, "multivector_model"))
        # a search only reads a stored reranker check (`retr check-reranker`, `retr eval`): it never builds one
        return cls(Searcher(folder, encoder, pipeline))

    @property
    def _open(self):
        """The searcher, while the index is open."""
        if self._searcher.closed:
            raise RetrError(f"{self._searcher.index.folder}: this Index was closed: open it again with "
                            f"retr.Index.load")
        return self._searcher

    @property
    def ids(self) -> list[str]:
        return list(self._open.index.ids)

    @property
    def manifest(self) -> IndexManifest:
        """The index's typed manifest (``.to_dict()`` for its JSON)."""
        return self._open.index.manifest

    @with_options
    def search(self, query: str, **options) -> SearchResult:
        """The top ``k`` documents for ``query``: ``mode`` a pipeline (bm25, dense, hybrid, an expression such as
        ``"bm25+rm3"`` or a ``retr.stages`` value); ``rerank`` a cross-encoder folder (``+rerank`` added if
        absent); ``filter`` ``{field: value}`` on the corpus records' other fields (every stage restricted);
        ``fusion`` / ``fusion_depth`` / ``passage_aggregate``: this search's, instead of the index's. The options,
        their defaults and checks are ``retr.retrieval.options.OPTIONS``' (the CLI's and the service's). The
        result's ``hits`` are typed (rank, id, score, title, text, metadata); ``latency_ms`` per stage."""
        from retr.retrieval.request import SearchRequest

        return self.run(SearchRequest.one(query, **options))[0]

    @with_options
    def search_batch(self, queries: Sequence[str], **options) -> list[SearchResult]:
        """``search`` for each query of ``queries`` (a list of str; a str is refused), in order, each searched
        alone: its hits never depend on the others."""
        from retr.retrieval.request import SearchRequest

        return self.run(SearchRequest.batch(queries, **options))

    @with_options
    def search_topics(self, topics: Mapping[str, str] | str | Path, **options):
        """A batch search to a ``Run`` (query id -> ranked hits, as `retr search --topics` writes it): ``topics``
        a mapping of query id -> query, or a topic file (TSV, JSONL, BEIR queries.jsonl, TREC topics), and
        ``search``'s options. The path of ``search`` and ``search_batch``: each query's hits are the ones it gets
        alone. Write the run with ``retr.eval.trec.write_run`` and score it with ``retr.eval.metrics.evaluate``."""
        from retr.retrieval.request import SearchRequest

        if isinstance(topics, (str, os.PathLike)):
            from retr.eval.topics import read_topics

            topics = read_topics(check_path(topics, "topics"))
        if not isinstance(topics, Mapping) or not topics:
            raise RetrError(f"topics must be a non-empty mapping of query id -> query, or a topic file, "
                            f"got {shown(topics)}")
        from retr.eval.topics import topic_problem

        ids = list(topics)
        if any(not isinstance(q, str) for q in ids):
            raise RetrError("topics: every query id must be a str")
        problem = next((p for p in (topic_problem(q, t) for q, t in topics.items()) if p), None)
        if problem:  # named by the topic's id, not its place in the batch
            raise RetrError(f"topics: {problem}")
        request = SearchRequest.batch(list(topics.values()), **options)
        return self._open.search_run(request, ids)

    def run(self, request: SearchRequest) -> list[SearchResult]:
        """One result per query of ``request`` (a ``retr.SearchRequest``, as `retr serve` and `retr search`
        build)."""
        return self._open.run(request)

    def add(self, corpus: str | Path, *, id_field: str | None = None, text_field: str | None = None,
            title_field: str | None = None):
        """Add (or, for ids already held, update) the documents of ``corpus`` without a rebuild, as `retr add`;
        this object then searches the new generation. Returns what changed."""
        from retr.indexes.corpus import CorpusFormat, load_corpus
        from retr.indexes.update import add_documents, recorded_format

        searcher = self._open
        fmt = CorpusFormat(check_text(id_field, "id_field"), check_text(text_field, "text_field"),
                           check_text(title_field, "title_field"))
        corpus_ = load_corpus(check_path(corpus, "corpus"), recorded_format(searcher.index.folder, fmt))
        return self._changed(add_documents(searcher.index.folder, corpus_))

    def delete(self, ids: Sequence[str], *, missing_ok: bool = False):
        """Delete the documents ``ids`` (a list of str; a str is refused, never read letter by letter), as
        `retr delete`: tombstones until ``compact``."""
        from retr.indexes.update import delete_documents

        searcher = self._open
        ids = check_names(ids, "ids")
        if not ids:
            raise RetrError("ids is empty: give the ids of the documents to delete")
        return self._changed(delete_documents(searcher.index.folder, ids, missing_ok=check_flag(missing_ok, "missing_ok")))

    def compact(self):
        """Fold deleted records away, as `retr compact` (search results do not change)."""
        from retr.indexes.update import compact_index

        return self._changed(compact_index(self._open.index.folder))

    def _changed(self, change):
        old = self._searcher
        self._searcher = old.reopened()
        old.close()
        return change

    @property
    def closed(self) -> bool:
        return self._searcher.closed

    def close(self) -> None:
        self._searcher.close()
        if self._temp is not None:
            import shutil

            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sparse(model: object):
    from retr.retrieval.sparse import SparseConfig

    name = check_text(model, "sparse_model")
    return SparseConfig(name) if name else None


def _index_config(model, backend, bm25, kind, max_length, use_cache, query_prompt, doc_prompt, passages, aggregate,
                  shards, executor, ray_address, ray_actors, dense_options: dict) -> IndexConfig:
    """An index's config from the options of ``Index.build`` / ``from_documents``, each checked; ``bm25``: True,
    False or a ``retr.retrieval.bm25.BM25Config`` (k1, b, variant, language)."""
    from retr.indexes.build import IndexConfig
    from retr.indexes.dense import DenseIndexConfig
    from retr.indexes.executors import EXECUTORS, ExecutorConfig
    from retr.retrieval.bm25 import BM25Config

    allowed = set(DenseIndexConfig.__dataclass_fields__) - {"kind"}
    unknown = sorted(set(dense_options) - allowed)
    if unknown:
        raise RetrError(f"unknown index option {unknown[0]!r}: choose from {', '.join(sorted(allowed))}")
    dense = DenseIndexConfig(kind=kind, **dense_options)
    encoder = _encoder(model, backend, None, max_length, query_prompt, doc_prompt)
    bm25_cfg = bm25 if isinstance(bm25, BM25Config) else (BM25Config() if check_flag(bm25, "bm25") else None)
    return IndexConfig(dense=dense, encoder=encoder, bm25=bm25_cfg,
                       use_cache=check_flag(use_cache, "use_cache"), passages=_passages(passages, aggregate),
                       shards=check_int(shards, "shards", 1, 4096),
                       executor=ExecutorConfig(name=check_choice(executor, "executor", EXECUTORS),
                                               address=check_text(ray_address, "ray_address"),
                                               actors=check_int(ray_actors, "ray_actors", 1, 4096)))


def _new_file(value: object, field: str) -> Path | None:
    """A path to write: its folder must exist (nothing is created above it), and it must not be a folder."""
    path = check_path(value, field, optional=True)
    if path is not None:
        if not path.parent.is_dir():
            raise RetrError(f"{field}: {path.parent} is not an existing folder: create it first")
        if path.is_dir():
            raise RetrError(f"{field}: {path} is a folder, not a file")
    return path


@_renamed(pipelines="modes", mode="modes", reranker="rerank", aggregate="passage_aggregate")
def evaluate(dataset: str | Path, modes: Sequence[str] = _DEFAULT_PIPELINES, *, split: str = "test",
             model: str | None = None, backend: str = defaults.BACKEND, query_backend: str | None = None,
             rerank: str | None = None, rerank_depth: int = defaults.RERANK_DEPTH,
             k_values: Sequence[int] = defaults.K_VALUES, kind: str = defaults.DENSE_KIND,
             fusion: str = defaults.FUSION, fusion_depth: int = defaults.FUSION_DEPTH,
             warmup: int = defaults.WARMUP, download: bool = True, run_dir: str | Path | None = None,
             out: str | Path | None = None, query_prompt: str | None = None,
             doc_prompt: str | None = None, passages: str | None = None,
             passage_aggregate: str = defaults.AGGREGATE, sparse_model: str | None = None,
             multivector_model: str | None = None) -> EvalReport:
    """`retr eval` from Python, with its options' names (``modes``: the pipelines, e.g. ``("bm25", "hybrid")``;
    ``rerank``: a cross-encoder folder for ``+rerank`` pipelines; ``multivector_model``: ``+maxsim``'s): the typed report (written to ``out`` as JSON
    when given; its folder must exist, as must ``run_dir``'s parent). ``mode`` and ``pipelines``, ``reranker``,
    ``aggregate``: the older names of ``modes``, ``rerank`` and ``passage_aggregate`` (a ``FutureWarning``)."""
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.indexes.dense import DenseIndexConfig
    from retr.retrieval.pipeline import PipelineConfig, parse_pipelines
    from retr.retrieval.rerank import RerankConfig

    dataset = check_path(dataset, "dataset")
    if isinstance(modes, (str, bytes, bytearray, Mapping, set, frozenset)) or not isinstance(modes, Iterable):
        check_names(modes, "modes")  # its one-line error
    try:  # each item a str (parsed here, once) or a retr.stages value
        pipelines = parse_pipelines(list(modes))
    except RetrError as e:
        raise RetrError(f"modes: {e}") from None
    ks = _cutoffs(k_values)
    out_path, run_path = _new_file(out, "out"), _new_file(run_dir, "run_dir")
    rerank = check_text(rerank, "rerank")
    rerank_depth = check_int(rerank_depth, "rerank_depth", 1, 10_000)  # checked with or without a cross-encoder
    cfg = EvalConfig(pipelines=pipelines, k_values=ks,
                     encoder=_encoder(model, backend, query_backend, None, query_prompt, doc_prompt),
                     dense=DenseIndexConfig(kind=kind),
                     pipeline=PipelineConfig(**checked(fusion=fusion, fusion_depth=fusion_depth),
                                             multivector_model=check_text(multivector_model, "multivector_model")),
                     reranker=RerankConfig(model=rerank, depth=rerank_depth) if rerank else None,
                     warmup=check_int(warmup, "warmup", 0, 1_000_000),
                     passages=_passages(passages, passage_aggregate), sparse=_sparse(sparse_model))
    split = check_text(split, "split")
    data = load_dataset(str(dataset), split or "", download=check_flag(download, "download"))
    from retr.retrieval.artifacts import check_output

    check_output(out_path, "out", folders={"dataset": str(data.path)})  # never over the files it reads
    report = run_eval(data, cfg, run_path)
    if out_path is not None:
        report.write(out_path)
    return report


def _cutoffs(k_values: object) -> tuple[int, ...]:
    """``k_values``: a list or tuple of cutoffs (ints >= 1), never a str."""
    if isinstance(k_values, (str, bytes, bytearray, Mapping)) or not isinstance(k_values, Iterable):
        raise RetrError(f"k_values must be a list of whole numbers >= 1, e.g. [10, 100], got {shown(k_values)}")
    from retr.eval.metrics import MAX_CUTOFF

    ks = tuple(sorted({check_int(k, "k_values", 1, MAX_CUTOFF) for k in k_values}))
    if not ks:
        raise RetrError("k_values is empty: give at least one cutoff, e.g. [10, 100]")
    return ks
