"""The eval report as types: what ``retr eval`` measured, per pipeline and per query, to and from JSON.

Every reader (the tables, ``benchmarks/check_beir.py``, ``benchmarks/speed.py``, the tests) reads these classes,
never the JSON keys.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from retr.retrieval.artifacts import atomic_write_text, read_text
from retr.retrieval.errors import RetrError

REPORT_FORMAT = "retr-eval-report"
REPORT_VERSION = 2


@dataclass(frozen=True)
class Percentiles:
    """Latency in milliseconds over ``n`` single queries (numpy's linear interpolation)."""
    p50: float
    p95: float
    p99: float
    mean: float
    n: int

    @classmethod
    def of(cls, samples_ms: list[float]) -> Percentiles:
        import numpy as np

        if not samples_ms:
            nan = float("nan")
            return cls(nan, nan, nan, nan, 0)
        ms = np.asarray(samples_ms, dtype=np.float64)
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        return cls(float(p50), float(p95), float(p99), float(ms.mean()), int(ms.size))


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    path: str
    split: str
    num_docs: int
    num_queries: int
    empty_docs: int = 0
    qrels_check: dict[str, int] = field(default_factory=dict)
    qrels_sha256: str | None = None  # ``Qrels.digest`` of the judgements scored (None: a report from before it)


@dataclass(frozen=True)
class PipelineResult:
    name: str
    metrics: dict[str, float]  # mean over scored queries, unrounded
    per_query: dict[str, dict[str, float]]  # query id -> metric -> value
    latency_ms: dict[str, Percentiles]  # stage (and "total") -> percentiles
    per_query_latency_ms: dict[str, dict[str, float]]  # query id -> stage (and "total") -> ms
    num_queries_scored: int
    qps: float
    wall_seconds: float
    build_seconds: float
    index_bytes: int
    docs_per_second: float
    run_file: str | None = None


@dataclass(frozen=True)
class EvalReport:
    dataset: DatasetInfo
    k_values: list[int]
    ignore_identical_ids: bool
    pipelines: dict[str, PipelineResult]
    index: dict[str, Any]  # folder and manifest
    reranker: dict[str, Any] | None
    config: dict[str, Any]
    environment: dict[str, Any]
    total_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, "format_version": REPORT_VERSION, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str, allow_nan=True) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "report") -> EvalReport:
        if not isinstance(d, dict) or d.get("format") != REPORT_FORMAT:
            raise RetrError(f"{source}: not a retr eval report (format {d.get('format') if isinstance(d, dict) else d!r})")
        if d.get("format_version") != REPORT_VERSION:
            raise RetrError(f"{source}: report format version {d.get('format_version')} is not "
                            f"{REPORT_VERSION}: run `retr eval` again")
        try:
            pipelines = {}
            for name, p in d["pipelines"].items():
                p = dict(p)
                p["latency_ms"] = {s: Percentiles(**v) for s, v in p["latency_ms"].items()}
                pipelines[name] = PipelineResult(**{f.name: p[f.name] for f in fields(PipelineResult) if f.name in p})
            return cls(dataset=DatasetInfo(**d["dataset"]), k_values=list(d["k_values"]),
                       ignore_identical_ids=bool(d["ignore_identical_ids"]), pipelines=pipelines, index=d["index"],
                       reranker=d.get("reranker"), config=d["config"], environment=d["environment"],
                       total_seconds=float(d.get("total_seconds", 0.0)))
        except (KeyError, TypeError, AttributeError) as e:
            raise RetrError(f"{source}: not a complete retr eval report ({type(e).__name__}: {e})") from None

    @classmethod
    def from_json(cls, text: str, source: str = "report") -> EvalReport:
        try:
            return cls.from_dict(json.loads(text), source)
        except json.JSONDecodeError as e:
            raise RetrError(f"{source}: unreadable JSON ({e})") from None

    def write(self, path: Path) -> None:
        atomic_write_text(Path(path), self.to_json(), output=True)

    @classmethod
    def read(cls, path: str | Path) -> EvalReport:
        return cls.from_json(read_text(Path(path)).removeprefix("\ufeff"), str(path))


SUITE_FORMAT = "retr-eval-suite"


@dataclass(frozen=True)
class EvalSuite:
    """The reports of one `retr eval` over several datasets, in the order given."""
    reports: list[EvalReport]

    def to_dict(self) -> dict[str, Any]:
        return {"format": SUITE_FORMAT, "format_version": REPORT_VERSION,
                "reports": [r.to_dict() for r in self.reports]}

    def write(self, path: Path) -> None:
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, default=str, allow_nan=True) + "\n",
                          output=True)


def read_reports(path: str | Path) -> list[EvalReport]:
    """The reports in a JSON file written by `retr eval`: one dataset's report, or a suite of several."""
    path = Path(path)
    try:
        d = json.loads(read_text(path).removeprefix("\ufeff"))  # a byte-order mark an editor added
    except json.JSONDecodeError as e:
        raise RetrError(f"{path}: unreadable JSON ({e})") from None
    if isinstance(d, dict) and d.get("format") == SUITE_FORMAT:
        if d.get("format_version") != REPORT_VERSION or not isinstance(d.get("reports"), list):
            raise RetrError(f"{path}: suite format version {d.get('format_version')} is not {REPORT_VERSION}: "
                            f"run `retr eval` again")
        return [EvalReport.from_dict(r, f"{path} (report {i + 1})") for i, r in enumerate(d["reports"])]
    return [EvalReport.from_dict(d, str(path))]
