"""Is B better than A, where, and at what cost: paired tests over per-query metrics, corrected for multiplicity.

Systems come from eval reports (one per dataset and pipeline; a report of many datasets gives many) or from TREC
run files scored against qrels. Within each dataset the first system is the baseline and every other one is
compared with it; where several reports are given, a pipeline of a later report is compared with the first
report's pipeline of the same name where it has one (A's hybrid with B's hybrid, A's bm25 with B's bm25), per metric, on the queries both scored: the mean difference, a paired two-sided t-test and a
paired randomization test, both corrected with Holm-Bonferroni across *everything* compared in the call; per-query
wins, ties and losses; and, where both carry per-query latency, the difference in median latency with a paired
bootstrap interval.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from retr.eval.report import read_reports
from retr.eval.stats import RESAMPLES, bootstrap_ci, holm, paired_t_test, randomization_test
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels

DEFAULT_METRICS = ("NDCG@10", "Recall@100")


@dataclass(frozen=True)
class System:
    label: str
    dataset: str
    per_query: dict[str, dict[str, float]]  # query -> metric -> value
    latency_ms: dict[str, float] | None = None  # query -> total ms
    pipeline: str | None = None  # its pipeline's name in a report (None: a run file)
    source: str = ""  # the file it came from


@dataclass(frozen=True)
class MetricComparison:
    dataset: str
    metric: str
    baseline: str
    system: str
    queries: int
    baseline_mean: float
    system_mean: float
    difference: float
    t: float
    p_t: float
    p_randomization: float
    p_t_holm: float
    p_randomization_holm: float
    wins: int
    ties: int
    losses: int


@dataclass(frozen=True)
class LatencyComparison:
    dataset: str
    baseline: str
    system: str
    queries: int
    baseline_p50_ms: float
    system_p50_ms: float
    difference_ms: float
    ci_low_ms: float
    ci_high_ms: float


@dataclass(frozen=True)
class Comparison:
    metrics: list[MetricComparison]
    latency: list[LatencyComparison]
    resamples: int
    seed: int

    def to_dict(self) -> dict:
        return {"format": "retr-comparison", **asdict(self)}


def systems_from(paths: Sequence[str | Path], qrels: Qrels | None = None, qrels_name: str = "qrels") -> list[System]:
    """Systems from eval reports (JSON) and run files (TREC, MS MARCO or JSONL; scored against ``qrels``)."""
    from retr.eval.metrics import DEFAULT_K_VALUES, evaluate
    from retr.eval.trec import read_run, with_judged_queries

    out: list[System] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise RetrError(f"{path}: no such file")
        with path.open("rb") as fh:
            head = fh.read(1)
        if head == b"{":
            for report in read_reports(path):
                for name, p in report.pipelines.items():
                    latency = {q: v["total"] for q, v in p.per_query_latency_ms.items() if "total" in v} or None
                    out.append(System(f"{path.stem}:{name}", report.dataset.name, p.per_query, latency, name,
                                      str(path)))
        else:
            if qrels is None:
                raise RetrError(f"{path}: a run file needs --qrels to be scored")
            run = with_judged_queries(read_run(path), qrels, str(path))
            ev = evaluate(run, qrels, DEFAULT_K_VALUES)  # the scorer of `retr eval` (pipeline_result)
            out.append(System(path.stem, qrels_name, ev.per_query, source=str(path)))
    keys = [(s.dataset, s.label) for s in out]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise RetrError(f"two systems on {dup[0]} are both named {dup[1]!r}: give the files different names")
    return out


def pairs(group: Sequence[System]) -> list[tuple[System, System]]:
    """(baseline, system) pairs within one dataset: every system against the first one, except that a pipeline
    from a later file than the first is compared with the first file's pipeline of the same name where that file
    has one (the same pipeline in two configurations; the first file's pipelines are not compared among
    themselves then)."""
    first = group[0]
    if all(s.source == first.source for s in group):
        return [(first, s) for s in group[1:]]
    named = {s.pipeline: s for s in group if s.source == first.source and s.pipeline is not None}
    return [(named.get(s.pipeline, first), s) for s in group if s.source != first.source]


def compare(systems: Sequence[System], metrics: Sequence[str] = DEFAULT_METRICS, resamples: int = RESAMPLES,
            seed: int = 0) -> Comparison:
    by_dataset: dict[str, list[System]] = {}
    for s in systems:
        by_dataset.setdefault(s.dataset, []).append(s)
    if not any(len(v) > 1 for v in by_dataset.values()):
        raise RetrError("nothing to compare: give at least two systems on the same dataset")
    rows, latency = [], []
    for dataset, group in by_dataset.items():
        for base, other in pairs(group):
            queries = sorted(set(base.per_query) & set(other.per_query))
            if not queries:
                raise RetrError(f"{base.label} and {other.label} share no scored query on {dataset}")
            for metric in metrics:
                if metric not in base.per_query[queries[0]] or metric not in other.per_query[queries[0]]:
                    have = ", ".join(sorted(base.per_query[queries[0]]))
                    raise RetrError(f"metric {metric!r} is not in {base.label} or {other.label} (they have: {have})")
                a = np.array([base.per_query[q][metric] for q in queries])
                b = np.array([other.per_query[q][metric] for q in queries])
                t, p_t = paired_t_test(a, b)
                d = b - a
                rows.append(dict(dataset=dataset, metric=metric, baseline=base.label, system=other.label,
                                 queries=len(queries), baseline_mean=float(a.mean()), system_mean=float(b.mean()),
                                 difference=float(d.mean()), t=t, p_t=p_t,
                                 p_randomization=randomization_test(a, b, resamples, seed),
                                 wins=int((d > 0).sum()), ties=int((d == 0).sum()), losses=int((d < 0).sum())))
            if base.latency_ms and other.latency_ms:
                lq = sorted(set(base.latency_ms) & set(other.latency_ms))
                if lq:
                    la = [base.latency_ms[q] for q in lq]
                    lb = [other.latency_ms[q] for q in lq]
                    diff, lo, hi = bootstrap_ci(la, lb, np.median, resamples, seed)
                    latency.append(LatencyComparison(dataset, base.label, other.label, len(lq), float(np.median(la)),
                                                     float(np.median(lb)), diff, lo, hi))
    p_t_holm = holm([r["p_t"] for r in rows])
    p_r_holm = holm([r["p_randomization"] for r in rows])
    out = [MetricComparison(**r, p_t_holm=pt, p_randomization_holm=pr)
           for r, pt, pr in zip(rows, p_t_holm, p_r_holm, strict=True)]
    return Comparison(out, latency, resamples, seed)


def comparison_table(c: Comparison, alpha: float = 0.05) -> str:
    from retr.eval.table import grid

    header = ["dataset", "metric", "baseline", "system", "n", "base", "sys", "diff", "p (t)", "p (rand)",
              "p Holm (t/rand)", "W/T/L", ""]
    rows = []
    for r in c.metrics:
        mark = "*" if r.p_randomization_holm < alpha and r.p_t_holm < alpha else ""
        rows.append([r.dataset, r.metric, r.baseline, r.system, str(r.queries), f"{r.baseline_mean:.4f}",
                     f"{r.system_mean:.4f}", f"{r.difference:+.4f}", f"{r.p_t:.4g}", f"{r.p_randomization:.4g}",
                     f"{r.p_t_holm:.3g}/{r.p_randomization_holm:.3g}", f"{r.wins}/{r.ties}/{r.losses}", mark])
    text = grid(header, rows)
    text += (f"\n* both corrected p-values < {alpha} (Holm-Bonferroni over all {len(c.metrics)} comparisons; "
             f"randomization: {c.resamples} seeded resamples, or exact)")
    if c.latency:
        lat = [[x.dataset, x.baseline, x.system, str(x.queries), f"{x.baseline_p50_ms:.2f}", f"{x.system_p50_ms:.2f}",
                f"{x.difference_ms:+.2f}", f"[{x.ci_low_ms:+.2f}, {x.ci_high_ms:+.2f}]"] for x in c.latency]
        text += "\n\n" + grid(["dataset", "baseline", "system", "n", "base p50 ms", "sys p50 ms", "diff ms",
                               "95% bootstrap CI"], lat)
    return text


def write_comparison(c: Comparison, path: Path) -> None:
    from retr.retrieval.artifacts import atomic_write_text

    atomic_write_text(Path(path), json.dumps(c.to_dict(), indent=2) + "\n")
