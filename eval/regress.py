"""Expected scores as data: a TOML file of (dataset, pipeline, options, metric, value, tolerance) entries, and the
runner that measures them all again and reports every drift.

    [[expect]]
    dataset = "adi"              # a folder, a name under --datasets DIR, or a name under $RETR_DATA
    pipeline = "hybrid"
    metric = "NDCG@10"
    value = 0.5248
    tolerance = 0.0005
    tier = "ci"                  # cheap enough for every CI run; others run when asked for (--tier all)
    options = { kind = "flat" }  # eval options: backend, query_backend, model, reranker, kind, fusion,
                                 # fusion_depth, split
    cpu = "bf16+int8"            # measured on this kind of CPU (Platform.kind); absent: the same on any CPU
    export = 3                   # measured with graphs of this export generation (graphs.EXPORT_GENERATION);
                                 # absent: no exported graph involved (BM25)

``model`` and ``reranker`` name a folder: a path, or a name under ``--models DIR`` (trained models are not in the
repository; a file of trained figures says in its comments which `retr train` command makes each one). A
``+rerank`` pipeline needs a ``reranker``.

Entries sharing a dataset and options are measured in one `retr eval` (every pipeline they name at once). An entry
with a ``cpu`` is measured only on that kind of CPU: exported graphs compute in bf16 or fp32, and use int8 or not,
by the CPU (a dense figure moves by up to 0.005 between them on the small collections). An entry with an
``export`` is measured only by a retr that exports its graphs the same way: another export procedure gives other
graphs, whose bf16 and int8 rounding move a dense figure as much; such entries are skipped, and said so, until
someone measures them again on their kind of CPU.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from retr.retrieval.artifacts import read_text
from retr.retrieval.errors import RetrError

if TYPE_CHECKING:
    from retr.retrieval.pipeline import Pipeline

logger = logging.getLogger(__name__)

OPTIONS = ("backend", "query_backend", "model", "reranker", "kind", "fusion", "fusion_depth", "split")
MODEL_OPTIONS = ("model", "reranker")  # folders: a path, or a name under the runner's models folder
TIERS = ("ci", "full")


def _where(source: str | Path, line: int) -> str:
    """An entry's position, as every message about it starts."""
    return f"{source}: [[expect]] #{line}"


@dataclass(frozen=True)
class Expected:
    dataset: str
    pipeline: Pipeline  # parsed once, from the file
    metric: str
    value: float
    tolerance: float
    tier: str = "full"
    options: dict = field(default_factory=dict)
    cpu: str | None = None  # the CPU kind it was measured on (Platform.kind); None: any
    export: int | None = None  # the graphs' export generation it was measured with; None: no graph involved
    line: int = 0  # the entry's position in its file, for messages
    source: str = ""  # the file it came from, for messages

    @property
    def where(self) -> str:
        return _where(self.source, self.line)

    @property
    def group(self) -> tuple:
        return self.dataset, tuple(sorted(self.options.items()))


@dataclass(frozen=True)
class Outcome:
    expected: Expected
    measured: float

    @property
    def drift(self) -> float:
        return self.measured - self.expected.value

    @property
    def ok(self) -> bool:
        return abs(self.drift) <= self.expected.tolerance


def load_expected(path: str | Path) -> list[Expected]:
    from retr.retrieval.pipeline import parse

    path = Path(path)
    try:
        data = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise RetrError(f"{path}: not valid TOML ({e})") from None
    entries = data.get("expect")
    if not isinstance(entries, list) or not entries:
        raise RetrError(f"{path}: no [[expect]] entries")
    out = []
    for i, e in enumerate(entries, start=1):
        where = _where(path, i)
        if not isinstance(e, dict):
            raise RetrError(f"{where}: not a table")
        missing = [k for k in ("dataset", "pipeline", "metric", "value", "tolerance") if k not in e]
        if missing:
            raise RetrError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(e) - {"dataset", "pipeline", "metric", "value", "tolerance", "tier", "options", "cpu",
                                 "export"})
        if unknown:
            raise RetrError(f"{where}: unknown key {unknown[0]!r}")
        options = e.get("options", {})
        bad = sorted(set(options) - set(OPTIONS)) if isinstance(options, dict) else ["(not a table)"]
        if bad:
            raise RetrError(f"{where}: unknown option {bad[0]!r} (known: {', '.join(OPTIONS)})")
        tier = e.get("tier", "full")
        if tier not in TIERS:
            raise RetrError(f"{where}: tier {tier!r} is not one of {', '.join(TIERS)}")
        try:
            value, tolerance = float(e["value"]), float(e["tolerance"])
        except (TypeError, ValueError):
            raise RetrError(f"{where}: value and tolerance must be numbers") from None
        if tolerance < 0:
            raise RetrError(f"{where}: tolerance must be >= 0")
        try:
            pipeline = parse(str(e["pipeline"]))
        except RetrError as err:
            raise RetrError(f"{where}: {err}") from None
        if pipeline.reranks and "reranker" not in options:
            raise RetrError(f"{where}: pipeline {pipeline.name!r} needs a reranker in its options")
        cpu = e.get("cpu")
        if cpu is not None and not isinstance(cpu, str):
            raise RetrError(f"{where}: cpu must be a string such as \"bf16+int8\" or \"fp32\"")
        export = e.get("export")
        if export is not None and (type(export) is not int or export < 1):
            raise RetrError(f"{where}: export must be a graph export generation, an integer >= 1")
        out.append(Expected(str(e["dataset"]), pipeline, str(e["metric"]), value, tolerance, tier,
                            dict(options), cpu, export, i, str(path)))
    return out


def for_this_cpu(entries: Sequence[Expected], kind: str) -> tuple[list[Expected], int]:
    """The entries that apply on a CPU of ``kind`` (``Platform.kind``, resolved once by the caller), and how many
    were measured on another kind."""
    kept = [e for e in entries if e.cpu is None or e.cpu == kind]
    return kept, len(entries) - len(kept)


def for_this_export(entries: Sequence[Expected], generation: int) -> tuple[list[Expected], int]:
    """The entries measured with graphs of export ``generation`` (``graphs.EXPORT_GENERATION``) or with none, and
    how many were measured with graphs exported another way."""
    kept = [e for e in entries if e.export is None or e.export == generation]
    return kept, len(entries) - len(kept)


def _dataset_spec(name: str, datasets: Path | None) -> str:
    if datasets is not None and (datasets / name).is_dir():
        return str(datasets / name)
    return name


def _model_spec(name: str | None, models: Path | None) -> str | None:
    """A model option as retr reads it: the folder of that name under ``models`` where one exists, else the name
    itself (a path, the bundled model's alias, or a hub name)."""
    if name is not None and models is not None and (models / name).is_dir():
        return str(models / name)
    return name


def graphs_of(group: Sequence[Expected]) -> tuple[str, str]:
    """The documents' and the queries' backends a group of entries was measured with: its options' where they name
    them; else the graphs its CPU kind's figures went through (kind ending in ``+int8``: the calibrated default for
    documents; any other: that default's base graph), with queries through the documents' base graph. Pinned, not
    measured: this machine's measured choices depend on which graphs its cache holds (an AMX Xeon whose cache held
    the int8 and onnx-int8 graphs took them, and 13 of its 30 "bf16" figures drifted), and a figure is only
    comparable through the graphs it was measured with."""
    from retr.retrieval.backends.registry import DEFAULT_BACKEND, base_of

    options = group[0].options
    kind = next((e.cpu for e in group if e.cpu is not None), None)
    documents = options.get("backend") or (DEFAULT_BACKEND if kind is None or kind.endswith("+int8")
                                           else base_of(DEFAULT_BACKEND).name)
    return documents, options.get("query_backend") or base_of(documents).name


def measure(entries: Sequence[Expected], datasets: Path | None = None, download: bool = False,
            models: Path | None = None) -> list[Outcome]:
    """Run one eval per (dataset, options) group and read every entry's metric from it."""
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.indexes.dense import DenseIndexConfig
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.models import ModelRef
    from retr.retrieval.pipeline import PipelineConfig, parse_pipelines
    from retr.retrieval.rerank import RerankConfig

    groups: dict[tuple, list[Expected]] = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    plan = []  # every group's models found before anything is measured: a missing one fails at once
    for (dataset, _), group in groups.items():
        names = [_model_spec(group[0].options.get(opt), models) for opt in MODEL_OPTIONS]
        for name in filter(None, names):
            try:
                ModelRef.resolve(name)
            except RetrError as err:
                raise RetrError(f"{group[0].where}: {err}") from None
        plan.append((dataset, group, *names))
    outcomes = []
    for dataset, group, model, reranker in plan:
        o = group[0].options
        ks = sorted({int(e.metric.rsplit("@", 1)[1]) for e in group if "@" in e.metric} | {10})
        pipe_defaults = PipelineConfig()
        documents, queries = graphs_of(group)
        cfg = EvalConfig(
            pipelines=parse_pipelines(list(dict.fromkeys(e.pipeline for e in group))), k_values=tuple(ks),
            encoder=EncoderConfig(model=model, backend=documents, query_backend=queries),
            dense=DenseIndexConfig(kind=o.get("kind", "flat")), bm25=BM25Config(),
            pipeline=PipelineConfig(fusion=o.get("fusion", pipe_defaults.fusion),
                                    fusion_depth=int(o.get("fusion_depth", pipe_defaults.fusion_depth))),
            reranker=RerankConfig(model=reranker) if reranker else None, warmup=1)
        logger.info("measuring %s (%s)", dataset, ", ".join(f"{k}={v}" for k, v in sorted(o.items())) or "defaults")
        report = run_eval(load_dataset(_dataset_spec(dataset, datasets), o.get("split", "test"), download=download),
                          cfg)
        for e in group:
            metrics = report.pipelines[str(e.pipeline)].metrics
            if e.metric not in metrics:
                raise RetrError(f"{e.where}: metric {e.metric!r} is not measured "
                                f"(choose from {', '.join(sorted(metrics))})")
            outcomes.append(Outcome(e, float(metrics[e.metric])))
    return outcomes


def outcome_table(outcomes: Sequence[Outcome]) -> str:
    from retr.eval.table import grid

    rows = []
    for o in outcomes:
        e = o.expected
        opts = ",".join(f"{k}={v}" for k, v in sorted(e.options.items())) or "-"
        rows.append([e.dataset, str(e.pipeline), opts, e.metric, f"{e.value:.4f}", f"{o.measured:.4f}",
                     f"{o.drift:+.4f}", f"±{e.tolerance:g}", "ok" if o.ok else "DRIFT"])
    return grid(["dataset", "pipeline", "options", "metric", "expected", "measured", "drift", "tolerance", ""], rows)


def markdown_table(entries: Sequence[Expected]) -> str:
    """The expected figures as the README shows them (generated from the file, never typed by hand)."""
    lines = ["| dataset | pipeline | options | metric | CPU | graphs | expected | tolerance |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(e.options.items())) or "defaults"
        graphs = f"export {e.export}" if e.export is not None else "-"
        lines.append(f"| {e.dataset} | {e.pipeline} | {opts} | {e.metric} | {e.cpu or 'any'} | {graphs} "
                     f"| {e.value:.4f} | ±{e.tolerance:g} |")
    return "\n".join(lines)
