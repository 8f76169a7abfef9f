"""The cross-encoder model: its folder checked, its training record read, its graph opened and scoring pairs."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from retr.retrieval import defaults
from retr.retrieval.backends import apart, cost, sample_texts
from retr.retrieval.backends.batching import fast_pair_tokenizer
from retr.retrieval.backends.chooser import Choice
from retr.retrieval.backends.export import SCORING, Calibration, ce_logits
from retr.retrieval.backends.graphs import Graph, graph_info
from retr.retrieval.backends.holder import ExportedModel
from retr.retrieval.backends.platform import this_platform
from retr.retrieval.backends.quiet import quiet_third_party
from retr.retrieval.backends.registry import DEFAULT_RERANK_BACKEND, get_backend, on_this_cpu
from retr.retrieval.errors import RetrError
from retr.retrieval.focus import DEFAULT_INPUTS, check_inputs, reader
from retr.retrieval.models import ModelRef
from retr.retrieval.rerank_check import (
    CHECK_SEED,
    PSEUDO_QUERIES,
    WEIGHT_RULE,
    CorpusCheck,
    RerankWeight,
    rule_weight,
)
from retr.retrieval.rerank_graphs import STATIC_INT8, PairGraphs, score_pairs
from retr.retrieval.types import check_float

logger = logging.getLogger(__name__)

# the shallowest depth within 0.005 dev nDCG@10 of the best in every dev study (benchmarks/rerank_budget.py,
# README "Reranking within a budget"): SciFact dev, 1-epoch cross-encoders over the trained hybrid. fp32, depths
# 10/20/30/50/100: +0.0181/+0.0153/+0.0155/+0.0152/+0.0158 over the first stage; bf16, depths 10/20/30:
# 0.7745/0.7806/0.7836. 100 (the default before) reranked no better, at 6x the cost of 20
DEFAULT_RERANK_DEPTH = defaults.RERANK_DEPTH
DEFAULT_RERANK_MAX_LENGTH = 256  # for a cross-encoder that records no training length


@dataclass(frozen=True)
class RerankConfig:
    model: str
    depth: int = DEFAULT_RERANK_DEPTH
    max_length: int | None = None  # None: the length the model was trained at (its record), else 256
    batch_size: int = 32  # torch backend: pairs per batch
    token_budget: int = 8192  # exported backends: padded tokens per batch (length-sorted)
    device: str = "cpu"
    # a name in the registry that offers cross-encoder graphs; None: measured here (retr.retrieval.rerank_graphs):
    # DEFAULT_RERANK_BACKEND's graph, or another one of the model's graphs already in the cache where it scores a
    # query's pairs faster here within the ranking-noise bound
    backend: str | None = None
    # weight of the cross-encoder in the final score (1.0: cross-encoder alone); None: the value
    # chosen on dev by `retr train cross-encoder` (in the folder's retr_manifest.json), else 1.0
    interpolation: float | None = None
    # on a corpus it was not trained on, measure the cross-encoder on pseudo-queries cut from that corpus and cap
    # its weight there by what they choose (retr.eval.pseudo; README "Reranking on other collections")
    corpus_check: bool = True
    # what the model reads of a document (a key of retr.retrieval.focus.INPUT_FORMS); None: the form it was
    # trained on (its record), else "head"
    inputs: str | None = None

    def __post_init__(self) -> None:
        if self.backend is not None:
            get_backend(self.backend, SCORING)
        if self.inputs is not None:
            check_inputs(self.inputs)
        if self.depth < 1 or (self.max_length is not None and self.max_length < 1):
            raise RetrError(f"rerank depth and max length must be >= 1, got {self.depth} and {self.max_length}")
        if self.interpolation is not None:
            check_float(self.interpolation, "--rerank-alpha (the cross-encoder's weight)", 0.0, 1.0)



def check_cross_encoder_dir(path: Path) -> dict:
    """Refuse a folder that is not a one-logit sequence-classification model; return its config.json."""
    cfg_path = path / "config.json"
    if not path.is_dir():
        raise RetrError(f"{path}: no such cross-encoder folder")
    if not cfg_path.is_file():
        raise RetrError(f"{path}: not a cross-encoder folder (no config.json)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RetrError(f"{cfg_path}: unreadable ({e})") from None
    if not isinstance(cfg, dict):
        raise RetrError(f"{cfg_path}: expected a JSON object")
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise RetrError(f"{path}: not a cross-encoder: its architectures are {archs or 'unset'}, "
                        f"expected a *ForSequenceClassification model (train one with `retr train cross-encoder`)")
    num_labels = len(cfg.get("id2label") or {0: "LABEL_0"})
    if num_labels != 1:
        raise RetrError(f"{path}: a classifier with {num_labels} labels, not a one-score cross-encoder")
    return cfg


def _training_record(path: Path) -> dict:
    """What `retr train cross-encoder` stored with the model (its retr_manifest.json); {} for any other folder."""
    manifest = path / "retr_manifest.json"
    try:
        record = json.loads(manifest.read_text()) if manifest.is_file() else {}
    except (OSError, ValueError):
        record = {}
    return record if isinstance(record, dict) else {}


def _trained_weight(record: dict, path: Path) -> float | None:
    """The weight chosen on dev at training. A model trained under an earlier rule (its manifest names another
    ``interpolation_rule``, or none: the raw dev peak) that stored its dev curve gets today's rule
    (``WEIGHT_RULE``) applied to that curve, so that every cross-encoder retr trained gets its weight the same way."""
    stored = record.get("interpolation")
    curve = record.get("dev_ndcg@10_by_interpolation")
    if stored is None or record.get("interpolation_rule") == WEIGHT_RULE or not isinstance(curve, dict) \
            or len(curve) != 11:
        return None if stored is None else float(stored)
    weight = rule_weight(curve)
    if weight != float(stored):
        logger.info("cross-encoder %s: weight %.1f by today's rule (%s) from its stored dev curve; it stored %.1f",
                    path, weight, WEIGHT_RULE, float(stored))
    return weight


def trained_reading(record: dict, positions: int | None = None, max_length: int | None = None,
                    inputs: str | None = None) -> tuple[int, str]:
    """The tokens and the input form (retr.retrieval.focus) a cross-encoder reads with: as given, else as it was
    trained (its ``record``), else its head at ``DEFAULT_RERANK_MAX_LENGTH``; never past its ``positions``."""
    length = max_length or int((record.get("config") or {}).get("max_length") or DEFAULT_RERANK_MAX_LENGTH)
    return (min(length, int(positions)) if positions else length,
            check_inputs(inputs or record.get("inputs") or DEFAULT_INPUTS))


def cross_encoder_reading(path: Path) -> tuple[int, str]:
    """``trained_reading`` of the cross-encoder folder ``path``."""
    return trained_reading(_training_record(path), check_cross_encoder_dir(path).get("max_position_embeddings"))


def cross_encoder_ref(name: str) -> ModelRef:
    """A cross-encoder named by a folder or, as ``--model`` names a bi-encoder, by a hub id (``org/name``) found in
    the local Hugging Face cache (downloaded where the hub is reachable): the same identity (content hash) and the
    same one-line error when offline and absent."""
    path = Path(name).expanduser()
    hub_id = not path.exists() and not name.startswith((".", "/", "~")) and name.count("/") == 1
    if not hub_id:
        check_cross_encoder_dir(path)
    ref = ModelRef.resolve(name if hub_id else str(path))
    check_cross_encoder_dir(ref.path)
    return ref


def _weighed_record(b: cost.Break) -> dict:
    """``CrossEncoderReranker.weighed`` as a report records it: per query, not per document."""
    even = b.break_even_docs
    return {"queries": b.docs, "base_ms_per_query": b.base_s * 1000, "int8_ms_per_query": b.int8_s * 1000,
            "making_s": b.calibration_s, "measured": b.measured, "saving_s": b.saving_s, "pays": b.pays,
            "break_even_queries": None if even == float("inf") else round(even)}


class CrossEncoderReranker:
    """Scores (query, document) pairs with a sentence-transformers ``CrossEncoder``: through an exported,
    verified graph (OpenVINO / ONNX Runtime, cached like the bi-encoder's) or with torch."""

    def __init__(self, config: RerankConfig):
        self.config = config
        self.ref = cross_encoder_ref(config.model)
        self.path = self.ref.path
        positions = check_cross_encoder_dir(self.path).get("max_position_embeddings")
        record = _training_record(self.path)
        self.max_length, self.inputs = trained_reading(record, positions, config.max_length, config.inputs)
        self._fast_pairs = fast_pair_tokenizer(self.path, self.max_length)
        self._read = reader(self.inputs, self.path, self.max_length)
        self.graph: Graph | None = None
        self.choice: Choice | None = None  # how the graph was chosen, where it was measured
        self.pair_graphs: PairGraphs | None = None
        self.weighed: cost.Break | None = None  # whether making its static int8 graph paid a run (``expect``)
        # its graphs: opened, found and named as the bi-encoder's are (the torch model loaded only to export)
        self.exported = ExportedModel(self.ref, SCORING, self.max_length, lambda: self.model,
                                      use_cache_alone=self._fast_pairs is not None)
        if config.device == "cpu":
            platform = this_platform()
            backend = on_this_cpu(get_backend(config.backend or DEFAULT_RERANK_BACKEND, SCORING), SCORING, platform)
            calibration = self._calibration() if backend.calibrated else None
            self.graph = self.exported.open(backend.name, calibration)
            if self.graph is not None:
                # the configured graph and the model's other cached graphs, timed on one query's pairs
                self.pair_graphs = PairGraphs(self.exported, self.graph, self._pair_ids, config.depth,
                                              self.max_length, config.token_budget, platform, self._calibration)
                if config.backend is None:
                    self.graph, self.choice = self.pair_graphs.chosen()
        chosen = _trained_weight(record, self.path)
        self.interpolation = config.interpolation if config.interpolation is not None \
            else chosen if chosen is not None else 1.0
        self.trained_corpus: str | None = record.get("corpus_sha256")  # None: not trained by retr
        self._warned: set[str] = set()
        self._checks: dict[tuple[str, str | None], CorpusCheck] = {}

    def expect(self, queries: int) -> cost.Break | None:
        """A run is about to rerank ``queries`` queries (an eval, a topics file). Where its graph is measured here
        (no backend named) and the model's static int8 graph is not in the cache yet, it is made first where those
        queries would save more than making it costs (``PairGraphs.worth_making``), and the graphs are chosen
        among again (timed, checked for ranking noise, stored). What was weighed, or None where nothing was."""
        if self.pair_graphs is None or self.config.backend is not None or queries < 1:
            return None
        weighed = self.pair_graphs.worth_making(queries)
        if weighed is None:
            return None
        self.weighed = weighed
        saving = f"{queries} queries at {weighed.base_s * 1000:.0f} ms each would save ~{weighed.saving_s:.0f} s"
        if not weighed.pays:
            logger.info("cross-encoder: not making its static int8 graph: %s through it, not more than making it "
                        "costs (~%.0f s)", saving, weighed.calibration_s)
            return weighed
        logger.info("cross-encoder: making its static int8 graph (~%.0f s, once per model): %s through it",
                    weighed.calibration_s, saving)
        try:
            self._make_apart(STATIC_INT8)
        except RetrError as e:  # disagrees with torch, or too noisy: refused, recorded, never weighed again
            logger.warning("cross-encoder static int8 graph refused (%s): pairs stay on the %s graph", e,
                           self.backend)
            return weighed
        self.pair_graphs = replace(self.pair_graphs)  # its candidates found again, the new graph among them
        self.graph, self.choice = self.pair_graphs.chosen()
        return weighed

    def _make_apart(self, backend: str) -> None:
        """Make (export, calibrate, check) this model's graph for ``backend`` into the cache in a child process:
        its torch export and calibration peak at ~1.2 GB for a MiniLM cross-encoder and, made in this process,
        kept it at 1.2-1.4 GB through the 809 queries that followed against 0.55-0.70 GB without it (2 EPYC
        cores); a child hands it all back when it ends. Its log records are logged here (``apart``); a refusal raises its
        ``RetrError`` here. Made in this process where a child cannot be started."""
        code = ("import sys\n"
                "from retr.retrieval.backends.apart import relay_logs\n"
                "relay_logs(int(sys.argv[1]))\n"
                "from retr.retrieval.errors import RetrError\n"
                "from retr.retrieval.rerank_model import CrossEncoderReranker, RerankConfig\n"
                "try:\n"
                "    CrossEncoderReranker(RerankConfig(model=sys.argv[2], max_length=int(sys.argv[3]),\n"
                "                                      inputs=sys.argv[4], backend=sys.argv[5], corpus_check=False))\n"
                "except RetrError as e:\n"
                "    print('refused: ' + str(e), file=sys.stderr); sys.exit(2)\n")
        try:
            refusal = apart.run(code, [str(self.path), str(self.max_length), self.inputs, backend])
        except OSError as e:
            logger.debug("no child process (%s): the %s graph is made in this one", e, backend)
            self.exported.open(backend, self._calibration())
            return
        except RuntimeError as e:
            raise RetrError(f"making it in a child process failed ({e})") from None
        if refusal is not None:
            raise RetrError(refusal)

    def trained_on(self, corpus_sha256: str | None) -> bool | None:
        """Whether this cross-encoder was trained on the corpus an index holds (None: unknown: a folder retr did
        not train, or no checksum)."""
        if self.trained_corpus is None or corpus_sha256 is None:
            return None
        return corpus_sha256 == self.trained_corpus

    def check_key(self, corpus_sha256: str, first_stage_model: str) -> str:
        return CorpusCheck.key(corpus_sha256, self.model_hash, first_stage_model, self.config.depth,
                               self.max_length, PSEUDO_QUERIES, CHECK_SEED, self.inputs)

    def adopt(self, check: CorpusCheck) -> None:
        """Use ``check`` (measured by ``retr.eval.pseudo.check_reranker``) on its corpus."""
        self._checks[(check.corpus_sha256, check.first_stage_model)] = check

    def needs_check(self, corpus_sha256: str | None) -> bool:
        """Whether the corpus check applies on this corpus: enabled, no weight given, and trained on another."""
        return self.config.corpus_check and self.config.interpolation is None \
            and self.trained_on(corpus_sha256) is False

    def find_check(self, corpus_sha256: str, first_stage_model: str | None) -> CorpusCheck | None:
        """The check of this cross-encoder on that corpus and first-stage model: adopted, or stored in the cache."""
        check = self._checks.get((corpus_sha256, first_stage_model))
        if check is None and first_stage_model is not None:
            check = CorpusCheck.load(self.check_key(corpus_sha256, first_stage_model))
            if check is not None:
                self.adopt(check)
        return check

    def weight_for(self, corpus_sha256: str | None, first_stage_model: str | None) -> RerankWeight:
        """The interpolation weight on the corpus an index holds (``first_stage_model``: the index's dense model
        hash). A weight the user gave wins; on the corpus the reranker was trained on (or where that is unknown),
        the weight chosen on that corpus's dev queries; on another corpus, that weight capped by what the corpus
        check chose there on pseudo-queries (README, "Reranking on other collections"): a reranker that loses on
        a collection's own text is turned down there. Unchecked, the trained weight stays, with a warning once per
        corpus."""
        if self.config.interpolation is not None:
            return RerankWeight(self.config.interpolation, "given")
        if self.trained_on(corpus_sha256) is not False:
            return RerankWeight(self.interpolation, "trained")
        check = self.find_check(corpus_sha256, first_stage_model) if self.config.corpus_check else None
        if check is not None:
            return RerankWeight(min(self.interpolation, check.weight), "checked", check)
        if corpus_sha256 not in self._warned:
            self._warned.add(corpus_sha256)
            logger.warning("cross-encoder %s was trained on another corpus (sha256 %s...) than this index's "
                           "(%s...) and has not been checked on it: rerankers can lose nDCG on collections they "
                           "never saw; `retr check-reranker INDEX MODEL` (or `retr eval`) checks it on pseudo-queries "
                           "from the corpus once and caps its weight",
                           self.path, self.trained_corpus[:12], corpus_sha256[:12])
        return RerankWeight(self.interpolation, "unchecked")

    @property
    def model_hash(self) -> str:
        return self.ref.hash

    @property
    def backend(self) -> str:
        return self.graph.variant if self.graph is not None else "torch"

    @functools.cached_property
    def model(self):
        """The torch CrossEncoder, loaded on first use."""
        from sentence_transformers import CrossEncoder

        with quiet_third_party("transformers", "sentence_transformers"):  # weight-loading bars off the terminal
            return CrossEncoder(str(self.path), max_length=self.max_length, device=self.config.device)

    def _pair_ids(self, query: str, texts: list[str]) -> tuple[list, list]:
        if self._fast_pairs is not None:
            return self._fast_pairs(query, texts)
        enc = self.model.tokenizer([(query, t) for t in texts], truncation=True, max_length=self.max_length,
                                   padding=False, return_token_type_ids=True)
        return enc["input_ids"], enc["token_type_ids"]

    def _calibration(self) -> Calibration:
        """What a static int8 cross-encoder is calibrated on, once per model: retr's fixed sample of questions, each
        paired with its own passage, the next question's passage and a long passage (relevant and not)."""
        questions, passages, long = sample_texts.questions(), sample_texts.passages(), sample_texts.long_passages()
        ids, types = [], []
        for i, q in enumerate(questions):
            a, b = self._pair_ids(q, [passages[i], passages[(i + 1) % len(passages)], long[i % len(long)]])
            ids += a
            types += b
        return Calibration.of(ids, types)

    def read(self, query: str, texts: list[str]) -> list[str]:
        """What the cross-encoder reads of ``texts`` after ``query`` (its input form)."""
        return self._read(query, texts)

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        texts = self.read(query, texts)
        if self.graph is None:
            return ce_logits(self.model, [(query, t) for t in texts], self.config.batch_size)
        return score_pairs(self.graph, *self._pair_ids(query, texts), self.config.token_budget)

    def describe(self) -> dict:
        return {"path": str(self.path), "hash": self.model_hash, "depth": self.config.depth,
                "max_length": self.max_length, "inputs": self.inputs, "interpolation": self.interpolation,
                "backend": self.backend,
                "trained_corpus_sha256": self.trained_corpus,
                "precision": graph_info(self.graph)["precision"],
                **({"chosen": self.choice.to_dict()} if self.choice is not None else {}),
                **({"static_int8_weighed": _weighed_record(self.weighed)} if self.weighed is not None else {})}
