"""The weighting rules of a cross-encoder over a first stage, and the record of a reranker check on a corpus."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from retr.retrieval.artifacts import atomic_write_text, cache_home, read_small
from retr.retrieval.errors import RetrError
from retr.retrieval.focus import DEFAULT_INPUTS
from retr.retrieval.types import Hit

logger = logging.getLogger(__name__)


def minmax(x: np.ndarray) -> np.ndarray:
    """``x`` scaled to [0, 1]; all ones where it does not spread."""
    span = float(x.max() - x.min()) if len(x) else 0.0
    return (x - x.min()) / span if span > 0 else np.ones_like(x)


def interpolate(ce: np.ndarray, first: np.ndarray, alpha: float) -> np.ndarray:
    """alpha * minmax(ce) + (1 - alpha) * minmax(first), both over the reranked head."""
    if alpha >= 1.0:
        return ce
    return alpha * minmax(ce) + (1.0 - alpha) * minmax(first)


def rerank_head(head: list[Hit], tail: list[Hit], ce: np.ndarray, alpha: float) -> list[Hit]:
    """``head`` reordered by its cross-encoder scores ``ce`` interpolated with its own scores (``interpolate``);
    ``tail`` after it, in its order."""
    scores = interpolate(ce, np.fromiter((h.score for h in head), dtype=np.float32, count=len(head)), alpha)
    order = np.argsort(-scores, kind="stable")
    ranked = [Hit(head[i].doc_id, float(scores[i])) for i in order]
    floor = float(scores.min()) if len(scores) else 0.0
    return ranked + [Hit(h.doc_id, floor - 1.0 - j) for j, h in enumerate(tail)]


WEIGHT_RULE = "smoothed_best_no_loss"  # what `smoothed_best` is, as models and checks record it


def smoothed_best(curve: dict[str, float]) -> str:
    """The weight (a key of ``curve``, weights in steps of 0.1, the smallest the first stage alone) whose
    nDCG@10 averaged with its neighbours' is highest, among the weights that measured no worse than the first
    stage alone; ties go to the smaller weight. A weight next to a cliff of its curve is fragile: a 1-epoch
    SciFact cross-encoder peaked on dev at 0.5, one step before a drop of 0.03 at 0.6, and at 0.5 it gained
    far less on test than at 0.3-0.4 (README, "Reranking on other collections"). But the average alone can pick
    a dip next to the first stage: on CISI's pseudo-queries, 0.3245 / 0.3203 / 0.3229 at 0 / 0.1 / 0.2 averaged
    to 0.1, a weight that lost on the very queries that chose it (and on CISI's judged ones).
    Used on dev queries by `retr train cross-encoder` and on pseudo-queries by the corpus check."""
    weights = sorted(curve, key=float)

    def smoothed(i: int) -> float:
        near = [curve[w] for w in weights[max(0, i - 1): i + 2]]
        return sum(near) / len(near)

    allowed = [i for i, w in enumerate(weights) if curve[w] >= curve[weights[0]]]
    return weights[max(allowed, key=lambda i: (smoothed(i), -float(weights[i])))]


def rule_weight(curve: Mapping) -> float:
    """``smoothed_best`` of a curve as stored in JSON (a model's record, a check): today's rule on old records."""
    return float(smoothed_best({str(k): float(v) for k, v in curve.items()}))


def checked_weight(curve: Mapping, gain_low: Mapping | None) -> float:
    """The weight a corpus check takes: ``rule_weight`` of its curve, kept only where the gain over the first stage
    there is reliable, i.e. the lower end of the paired bootstrap interval of the pseudo-queries' mean nDCG@10 gain
    at that weight (``gain_low``, measured by retr.eval.pseudo) is above 0; else 0, the first stage alone. A curve's
    best point can be noise: SciFact-trained rerankers chose 0.4 on a pseudo-query gain of +0.007 and lost 0.036
    and 0.015 on two collections' judged queries. A check stored before the bound was measured (None) keeps its
    curve's weight."""
    weight = rule_weight(curve)
    if gain_low is None or weight <= 0.0:
        return weight
    return weight if float(gain_low.get(f"{weight:.1f}", -1.0)) > 0.0 else 0.0


PSEUDO_QUERIES = 200  # pseudo-queries per corpus check (eval/pseudo.py); fewer than MIN_PSEUDO_QUERIES: no check
MIN_PSEUDO_QUERIES = 30
CHECK_SEED = 7


@dataclass(frozen=True)
class CorpusCheck:
    """A cross-encoder measured on a corpus it was not trained on, without judged queries (``retr.eval.pseudo``):
    nDCG@10 of pseudo-queries cut out of the corpus's own documents at every interpolation weight, reranking the
    first stage's top ``depth``; ``weight`` is the curve's ``smoothed_best``."""

    corpus_sha256: str
    reranker_hash: str
    first_stage: str  # the pipeline reranked on the pseudo-queries
    first_stage_model: str  # the index's dense model hash
    depth: int
    max_length: int
    queries: int  # cut (up to PSEUDO_QUERIES)
    seed: int
    weight: float
    curve: dict[str, float]
    first_stage_ndcg: float
    seconds: float

    inputs: str = DEFAULT_INPUTS  # what the cross-encoder read of each document (retr.retrieval.focus)
    # per weight: the lower end of the 95% paired bootstrap interval of the mean nDCG@10 gain over the first stage
    gain_low: dict[str, float] | None = None

    @staticmethod
    def key(corpus_sha256: str, reranker_hash: str, first_stage_model: str, depth: int, max_length: int,
            queries: int, seed: int, inputs: str = DEFAULT_INPUTS) -> str:
        raw = f"{corpus_sha256}|{reranker_hash}|{first_stage_model}|{depth}|{max_length}|{queries}|{seed}"
        if inputs != DEFAULT_INPUTS:  # checks of the head form keep the keys they were stored under
            raw += f"|{inputs}"
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    @staticmethod
    def path(key: str) -> Path:
        return cache_home() / "rerank-checks" / f"{key}.json"

    @classmethod
    def load(cls, key: str) -> CorpusCheck | None:
        """The check stored under ``key``, or None (absent, or unreadable: then it is measured again). Its weight
        is its curve's ``smoothed_best`` by today's rule (a check stored under an earlier rule keeps its curve)."""
        path = cls.path(key)
        if not path.is_file():
            return None
        try:
            check = cls(**json.loads(path.read_text(encoding="utf-8")))
            weight = checked_weight(check.curve, check.gain_low)
        except (OSError, ValueError, TypeError, AttributeError) as e:
            logger.warning("reranker check %s unreadable (%s): measured again", path, e)
            return None
        if weight != check.weight:
            logger.info("reranker check %s: weight %.1f by today's rule (%s) from its curve; it stored %.1f", path,
                        weight, WEIGHT_RULE, check.weight)
        return replace(check, weight=weight)

    def save(self, key: str) -> Path:
        path = self.path(key)
        atomic_write_text(path, json.dumps(asdict(self), indent=2) + "\n")
        return path

    def save_beside(self, folder: Path, key: str) -> Path:
        """Store this check beside the index ``folder`` (``beside_path``), so that a copy of the index keeps it."""
        path = beside_path(folder, key)
        if path.parent.is_symlink() or (path.parent.exists() and not path.parent.is_dir()):
            raise RetrError(f"{path.parent}: not a folder of the index (a symlink or a file): the check is not stored")
        atomic_write_text(path, json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load_beside(cls, folder: Path, key: str, corpus_sha256: str, reranker_hash: str,
                    first_stage_model: str) -> CorpusCheck | None:
        """The check stored beside the index ``folder`` under ``key``, where it is of that corpus, cross-encoder and
        first-stage model; None where absent. A damaged or altered file (not a small regular JSON file of a check's
        typed fields, or of another corpus or model) is ignored with a warning: no check."""
        path = beside_path(folder, key)
        try:
            if path.parent.is_symlink():
                raise RetrError(f"{path.parent}: a symlink, not a folder of the index")
            check = cls.parse(read_small(path, MAX_CHECK_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, RetrError, ValueError) as e:
            logger.warning("reranker check %s ignored (%s): not checked", path, e)
            return None
        found = (check.corpus_sha256, check.reranker_hash, check.first_stage_model)
        if found != (corpus_sha256, reranker_hash, first_stage_model):
            logger.warning("reranker check %s ignored: it is of another corpus, cross-encoder or first stage", path)
            return None
        return check

    @classmethod
    def parse(cls, data: bytes) -> CorpusCheck:
        """A check from its JSON, every field typed (``ValueError`` naming the field otherwise); its weight by
        today's rule from its curve."""
        raw = json.loads(data.decode("utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        known = {f.name: f for f in fields(cls)}
        for name in raw:
            if name not in known:
                raise ValueError(f"unknown field {name!r}")
        for name, field in known.items():
            if name not in raw:
                if field.default is MISSING:
                    raise ValueError(f"field {name!r} missing")
                continue
            _check_field(name, raw[name])
        check = cls(**raw)
        return replace(check, weight=checked_weight(check.curve, check.gain_low))


INDEX_CHECKS = "rerank-checks"  # the folder of an index that holds its reranker checks (one small JSON file each)
MAX_CHECK_BYTES = 64 << 10
_KEY_RE = re.compile(r"^[0-9a-f]{32}$")
_ID_FIELDS = ("corpus_sha256", "reranker_hash", "first_stage_model")
_INT_FIELDS = ("depth", "max_length", "queries", "seed")
_NUMBER_FIELDS = ("weight", "first_stage_ndcg", "seconds")


def keeps_checks(folder: Path) -> bool:
    """Whether the index ``folder`` keeps its reranker checks beside it (``INDEX_CHECKS``): every index folder but
    the ones retr builds in its own cache (`retr eval --dataset`), whose checks the cache alone holds."""
    try:
        return not Path(folder).resolve().is_relative_to(cache_home().resolve())
    except OSError:
        return True


def beside_path(folder: Path, key: str) -> Path:
    """Where the check under ``key`` (``CorpusCheck.key``: 32 hex digits, never a path) is stored in an index."""
    if not _KEY_RE.match(key):
        raise ValueError(f"not a reranker check key: {key!r}")
    return Path(folder) / INDEX_CHECKS / f"{key}.json"


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def _check_field(name: str, value: object) -> None:
    if name in _ID_FIELDS:
        ok = isinstance(value, str) and 0 < len(value) <= 128 and re.fullmatch(r"[\w.:-]+", value) is not None
    elif name in _INT_FIELDS:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31
    elif name in _NUMBER_FIELDS:
        ok = _number(value)
    elif name in ("curve", "gain_low"):
        ok = (value is None and name == "gain_low") or (
            isinstance(value, dict) and 0 < len(value) <= 101
            and all(isinstance(k, str) and _number(_float(k)) and _number(v) for k, v in value.items()))
    else:  # first_stage, inputs
        ok = isinstance(value, str) and len(value) <= 256
    if not ok:
        raise ValueError(f"field {name!r} holds {str(value)[:40]!r}")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


WEIGHT_SOURCES = {  # what a report's reranker.weight_source means
    "given": "set by the user (--rerank-alpha)",
    "trained": "chosen on the dev queries of the corpus the reranker was trained on (or not trained by retr)",
    "checked": "the smaller of the trained weight and the one the corpus check chose on pseudo-queries",
    "unchecked": "the trained weight, on a corpus it was not trained on and not checked on",
}


@dataclass(frozen=True)
class RerankWeight:
    """The weight a reranker gets on one corpus, and why (``CrossEncoderReranker.weight_for``)."""

    weight: float
    source: str  # a key of WEIGHT_SOURCES
    check: CorpusCheck | None = None

    def __post_init__(self) -> None:
        if self.source not in WEIGHT_SOURCES:
            raise ValueError(f"unknown weight source {self.source!r}")
