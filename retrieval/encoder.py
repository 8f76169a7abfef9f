"""The bi-encoder: a sentence-transformers model that embeds queries and documents into L2-normalised float32
vectors (inner product = cosine), through a verified exported graph or torch.

Which graph serves which text is settled once, never reassigned: documents and other texts take the graph of
``EncoderConfig.backend`` (its base graph where it is calibrated); a corpus being indexed takes the calibrated
graph (``encode_corpus``, which returns what it used); queries take ``query_backend``'s graph, resolved on first
use.

The encoder is the facade; each of its other roles has one home: ``retrieval.tokens`` (tokenisation),
``backends.holder`` (the exported model's graphs: opened, found, named), ``retrieval.corpus_plan`` (which graph
encodes a corpus, and its name in cache keys) and ``retrieval.query_graphs`` (which graph encodes a query).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

import numpy as np

from retr.retrieval.backends.batching import run_sorted
from retr.retrieval.backends.export import EMBEDDING
from retr.retrieval.backends.graphs import Graph, graph_info, lone_feed
from retr.retrieval.backends.holder import ExportedModel
from retr.retrieval.backends.platform import Platform, this_platform
from retr.retrieval.backends.quiet import quiet_third_party
from retr.retrieval.backends.registry import DEFAULT_BACKEND, base_of, get_backend
from retr.retrieval.corpus_plan import CorpusPlan, CorpusPlanner, recorded_graph
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef, check_bi_encoder_dir
from retr.retrieval.progress import Progress
from retr.retrieval.query_graphs import QueryGraphs
from retr.retrieval.tokens import Tokens, prefixed


@dataclass(frozen=True)
class EncoderConfig:
    model: str | None = None  # None: the bundled all-MiniLM-L6-v2
    max_length: int | None = None  # None: the model's own max_seq_length
    batch_size: int = 32  # torch backend: texts per batch
    # exported backends: padded tokens per batch (length-sorted, no waste beyond it). Activation memory grows with
    # it, per stream: measured on SciFact, OpenVINO int8 on 2 streams, `retr eval` peaked at ~1.17 GB at 4096 vs
    # 1.56 at 8192. 2048 against 4096, 1,000 SciFact-length documents in one process, rounds alternating: AMX Xeon
    # with AMX refused, static int8 9.65 against 10.48 s, int8 weights 13.1 against 14.4 s, fp32 23.3 against
    # 25.9 s (faster in every round); AMX granted, bf16 about the same (7.9 against 8.1 s, then 14.1 against 13.6 s
    # in a slower hour: each faster in 5 of 10 rounds). Less activation memory everywhere
    token_budget: int = 2048
    device: str = "cpu"
    backend: str = DEFAULT_BACKEND  # a name in retr.retrieval.backends.registry.BACKENDS
    calibration_min_docs: int = 1000  # calibrated backends: smaller corpora are encoded by the base graph
    # queries: None = the fastest lone-query graph on this machine among those in the cache that add no more
    # ranking noise than query_graphs.MAX_QUERY_RANK_NOISE against the documents' graph (retrieval.query_graphs: timed
    # and checked once, then stored); a name pins it (a calibrated backend's queries take its base graph)
    query_backend: str | None = None
    # text put before every query / document; None: the model's own (sentence-transformers' ``prompts``)
    query_prompt: str | None = None
    doc_prompt: str | None = None

    def __post_init__(self) -> None:
        get_backend(self.backend)
        if self.query_backend is not None:
            get_backend(self.query_backend)

    @property
    def resolved_query_backend(self) -> str:
        return self.query_backend or self.backend


@dataclass(frozen=True)
class Prompts:
    """The texts put before queries and documents (empty: none)."""
    query: str = ""
    document: str = ""

    @classmethod
    def resolve(cls, model: ModelRef, query: str | None, document: str | None) -> Prompts:
        """The given prompts, else the model's: its ``query`` prompt, its ``document``/``passage``/``corpus`` one,
        else its default prompt (sentence-transformers applies that one to every text)."""
        named, default = model.named_prompts()
        fallback = named[default] if default else ""
        if query is None:
            query = named.get("query", fallback)
        if document is None:
            document = next((named[n] for n in ("document", "passage", "corpus", "doc") if n in named), fallback)
        return cls(query, document)

    def to_dict(self) -> dict[str, str]:
        return {"query": self.query, "document": self.document}


@dataclass(frozen=True)
class CorpusEncoding:
    embeddings: np.ndarray  # (n, dim) float32, normalised
    graph: dict  # how they were encoded: backend, precision, agreement with torch
    executor: dict | None = None  # where, when not in this process (retr.indexes.executors)
    truncation: dict | None = None  # Tokens.truncation of the texts, where the encoding measured it


class BiEncoder:
    """Embeds text with a sentence-transformers model.

    With an exported backend whose verified graph is already cached, neither torch nor sentence-transformers is
    imported: the tokenizer and the graph are all a query needs. Nor on a first run of a BERT model's OpenVINO
    graph, which is built from the weights (``backends.direct``).
    """

    def __init__(self, config: EncoderConfig = EncoderConfig(), model: ModelRef | None = None):
        self.config = config
        self.ref = model or ModelRef.resolve(config.model)
        check_bi_encoder_dir(self.ref.path)
        self.prompts = Prompts.resolve(self.ref, config.query_prompt, config.doc_prompt)
        max_length = int(config.max_length) if config.max_length else self.ref.max_seq_length()
        if max_length is None:  # no sentence_bert_config.json: the model knows
            max_length = int(self.model.max_seq_length)
        self.tokens = self._tokens(max_length)
        self.exported = ExportedModel(self.ref, EMBEDDING, max_length, lambda: self.model, self.tokens.fast)
        # documents and any other text: the backend's graph (its base graph where it is calibrated); None: torch
        self.graph: Graph | None = self.exported.open(base_of(config.backend).name) if config.device == "cpu" else None
        if self.graph is None:
            model_ = self.model
            get_dim = getattr(model_, "get_embedding_dimension", None) or model_.get_sentence_embedding_dimension
            self.dim = int(get_dim() or model_.encode(["x"], convert_to_numpy=True, show_progress_bar=False).shape[1])
            if int(model_.max_seq_length) != self.max_length:  # torch encodes: its length is the one that counts
                self.tokens = self._tokens(int(model_.max_seq_length))
                self.exported = replace(self.exported, max_length=self.max_length)
        else:
            self.dim = self.graph.dim

    def _tokens(self, max_length: int) -> Tokens:
        return Tokens(self.ref.path, max_length, lambda: self.model.tokenizer, self.prompts.document)

    @property
    def max_length(self) -> int:
        """The tokens a text is cut at (``tokens.max_length``)."""
        return self.tokens.max_length

    # -- identity -------------------------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.ref.id

    @property
    def model_hash(self) -> str:
        return self.ref.hash

    @property
    def backend(self) -> str:
        """The backend documents are encoded with: the configured one where its graph loaded, else the one that
        stood in (onnx without openvino, torch without a graph)."""
        if self.graph is None:
            return "torch"
        return self.config.backend if self.graph.variant == base_of(self.config.backend).name else self.graph.variant

    def describe(self) -> dict:
        info = graph_info(self.graph)
        return {"id": self.model_id, "hash": self.model_hash, "architecture": self.ref.architecture(),
                "dim": self.dim, "max_length": self.max_length,
                "path": str(self.ref.path), "backend": self.backend, "precision": info["precision"],
                "prompts": self.prompts.to_dict()}

    # -- torch --------------------------------------------------------------------------------------------------
    @functools.cached_property
    def model(self):
        """The sentence-transformers model, loaded on first use."""
        from sentence_transformers import SentenceTransformer

        try:
            with quiet_third_party("transformers", "sentence_transformers"):  # weight-loading bars off the terminal
                st = SentenceTransformer(str(self.ref.path), device=self.config.device)
        except OSError as e:
            raise RetrError(f"cannot load model {self.model_id!r}: {str(e).splitlines()[0]}") from None
        if self.config.max_length:
            st.max_seq_length = int(self.config.max_length)
        return st

    # -- encoding -----------------------------------------------------------------------------------------------
    def encode(self, texts: list[str], show_progress: bool = False, batch_size: int | None = None) -> np.ndarray:
        """Any texts, shape (n, dim), through the document graph (never the calibrated one)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.graph is not None:
            return self._run(self.graph, self.tokens.ids(texts), show_progress)
        size = batch_size or self.config.batch_size
        step = size * 16  # sentence-transformers sorts by length within each call: chunks of many batches
        parts = []
        with _progress(len(texts), show_progress) as bar:
            for i in range(0, len(texts), step):
                parts.append(self.model.encode(texts[i:i + step], batch_size=size, convert_to_numpy=True,
                                               normalize_embeddings=True, show_progress_bar=False))
                bar.update(len(parts[-1]))
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

    def encode_corpus(self, texts: list[str], show_progress: bool = False) -> CorpusEncoding:
        """The documents of a corpus to index. With a calibrated backend, at least ``calibration_min_docs`` texts
        and a CPU where int8 pays (``CorpusPlanner.choice``) they go through the model's static int8 graph
        (``calibrated_graph``; the base graph where that one is refused); otherwise, as ``encode`` does."""
        plan = self.corpus_plan(texts)
        if plan.graph is None:
            return CorpusEncoding(self.encode(plan.texts, show_progress=show_progress), graph_info(None))
        t0 = time.perf_counter()
        vectors = self._run(plan.graph, plan.tokens, show_progress)
        self.planner.speeds.record_encoding(plan, time.perf_counter() - t0)  # a measurement of its graph, kept
        return CorpusEncoding(vectors, plan.graph_info(), truncation=plan.truncation)

    def corpus_plan(self, texts: list[str]) -> CorpusPlan:
        """What ``encode_corpus`` runs: the documents' graph (the calibrated one where it applies) and their token
        ids, for an executor that runs the batches elsewhere (``retr.indexes.executors``)."""
        return self.planner.plan(prefixed(self.prompts.document, texts))

    @functools.cached_property
    def platform(self) -> Platform:
        return this_platform()

    @functools.cached_property
    def planner(self) -> CorpusPlanner:
        """Which graph encodes a corpus of each size, and its name in cache keys (``graph_id``)."""
        return CorpusPlanner(self.exported, self.tokens, self.graph, backend=self.backend,
                             configured=self.config.backend, min_docs=self.config.calibration_min_docs,
                             token_budget=self.config.token_budget, platform=self.platform)

    @property
    def calibrated_graph(self) -> Graph | None:
        """The calibrated backend's graph for this model (``CorpusPlanner.calibrated_graph``)."""
        return self.planner.calibrated_graph

    def encode_like(self, texts: list[str], recorded: dict, show_progress: bool = False) -> np.ndarray:
        """Texts through the graph that encoded an index's documents (``recorded``: that graph's info), so that
        documents added to the index sit with the ones already there (``CorpusPlanner.like``: the base graph
        stands in, with a warning, where that graph is not in this machine's cache)."""
        texts = prefixed(self.prompts.document, texts)
        graph = recorded_graph(self.planner, recorded)
        if graph is not None:
            return self._run(graph, self.tokens.ids(texts), show_progress)
        return self.encode(texts, show_progress=show_progress)

    def _run(self, graph: Graph, tok: list, show_progress: bool) -> np.ndarray:
        """Length-sorted batches under a token budget, each padded only to its own longest text."""
        if len(tok) == 1:  # the query path: no sorting, no progress bar
            return graph.runner(lone_feed(graph, tok[0], self.max_length))
        out = np.empty((len(tok), self.dim), dtype=np.float32)
        with _progress(len(tok), show_progress) as bar:
            run_sorted(graph.runner, tok, self.config.token_budget, out, on_done=lambda idx: bar.update(len(idx)))
        return out

    @functools.cached_property
    def query_graphs(self) -> QueryGraphs:
        """Which graph queries go through (given, or chosen among the cached ones by speed and ranking noise)."""
        return QueryGraphs(self.exported, self.tokens, self.graph, given=self.config.query_backend,
                           backend=self.config.backend, query_prompt=self.prompts.query, platform=self.platform,
                           run=lambda graph, tok: self._run(graph, tok, False),
                           calibration=lambda: self.planner.calibration)

    @property
    def query_graph(self) -> Graph | None:
        """The graph queries go through (``QueryGraphs.graph``; None: torch)."""
        return self.query_graphs.graph

    def encode_queries(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        """Queries, shape (n, dim), through the query graph."""
        texts = prefixed(self.prompts.query, texts)
        graph = self.query_graph
        if graph is None or not texts:
            return self.encode(texts, show_progress=show_progress)
        if not graph.backend.batch_invariant:
            # dynamic int8 scales each activation tensor by its own range: batched with others, a query would get
            # another vector than alone. One at a time, a query's vector never depends on its neighbours.
            out = np.empty((len(texts), self.dim), dtype=np.float32)
            with _progress(len(texts), show_progress) as bar:
                for i, t in enumerate(texts):
                    out[i] = self._run(graph, self.tokens.ids([t]), False)[0]
                    bar.update(1)
            return out
        return self._run(graph, self.tokens.ids(texts), show_progress)

    def encode_query(self, text: str) -> np.ndarray:
        """One query, shape (1, dim): the single-query path (no progress bar, no sorting)."""
        return self.encode_queries([text])

    def describe_queries(self) -> dict:
        """How queries are encoded (resolves the query graph if it is not resolved yet), with the measured choice
        where there was one."""
        return self.query_graphs.describe()


def _progress(total: int, show: bool) -> Progress:
    return Progress(total, "encoding", unit="doc", show=show)
