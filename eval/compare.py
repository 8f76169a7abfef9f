"""Is B better than A, where, and at what cost: paired tests over per-query metrics, corrected for multiplicity.

Systems come from eval reports (one per dataset and pipeline; a report of many datasets gives many) or from TREC
run files scored against qrels. Given one file, within each dataset the first system is the baseline and every
other one is compared with it. Given several, only systems of different files are compared: a pipeline of a later
file with the first file's pipeline of the same name where it has one (A's hybrid with B's hybrid), else with its
first, on the datasets both hold (a dataset in one file only is named, not compared). Per metric, on the queries
both scored: the mean difference, a paired two-sided t-test and a paired randomization test, both corrected with
Holm-Bonferroni across everything compared in the call; per-query wins, ties and losses. Where both carry
per-query latency, their medians and the difference: within one run with a paired bootstrap interval; across runs
(another process, perhaps another load or machine) shown only, never tested. Systems scored against other
judgements (reports record a digest of theirs) are never compared.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from retr.eval.report import read_reports
from retr.eval.stats import RESAMPLES, bootstrap_ci, holm, paired_t_test, randomization_test
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("NDCG@10", "Recall@100")


@dataclass(frozen=True)
class System:
    label: str
    dataset: str
    per_query: dict[str, dict[str, float]]  # query -> metric -> value
    latency_ms: dict[str, float] | None = None  # query -> total ms
    pipeline: str | None = None  # its pipeline's name in a report (None: a run file)
    source: str = ""  # the file it came from
    judgements: str | None = None  # ``Qrels.digest`` of what it was scored against (None: a report from before)
    ranked: frozenset[str] | None = None  # a run file's judged queries it has hits for (None: a report's: all)


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
    ci_low_ms: float | None  # None: measured in different runs (no interval: the environment differs)
    ci_high_ms: float | None


@dataclass(frozen=True)
class Comparison:
    metrics: list[MetricComparison]
    latency: list[LatencyComparison]
    resamples: int
    seed: int
    unpaired: list[str] = field(default_factory=list)  # datasets held by one of several files only: not compared

    def to_dict(self) -> dict:
        return {"format": "retr-comparison", **asdict(self)}


def systems_from(paths: Sequence[str | Path], qrels: Qrels | None = None, qrels_name: str = "qrels",
                 k_values: Sequence[int] | None = None) -> list[System]:
    """Systems from eval reports (JSON) and run files (TREC, MS MARCO or JSONL; scored against ``qrels`` at
    ``k_values``, default ``DEFAULT_K_VALUES``)."""
    from retr.eval.metrics import DEFAULT_K_VALUES, evaluate
    from retr.eval.trec import read_run, with_judged_queries

    k_values = sorted(set(k_values or DEFAULT_K_VALUES))
    judgements = qrels.digest() if qrels is not None else None  # one set of judgements for every run file
    out: list[System] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise RetrError(f"{path}: no such file")
        if _is_report(path):
            for report in read_reports(path):
                for name, p in report.pipelines.items():
                    latency = {q: v["total"] for q, v in p.per_query_latency_ms.items() if "total" in v} or None
                    out.append(System(f"{path.stem}:{name}", report.dataset.name, p.per_query, latency, name,
                                      str(path), report.dataset.qrels_sha256))
        else:
            if qrels is None:
                raise RetrError(f"{path}: a run file needs --qrels to be scored")
            raw = read_run(path)
            run = with_judged_queries(raw, qrels, str(path))
            ev = evaluate(run, qrels, k_values)  # the scorer of `retr eval` (pipeline_result)
            out.append(System(path.stem, qrels_name, ev.per_query, source=str(path), judgements=judgements,
                              ranked=frozenset(q for q in qrels if q in raw and raw[q])))
    keys = [(s.dataset, s.label) for s in out]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise RetrError(f"two systems on {dup[0]} are both named {dup[1]!r}: give the files different names")
    return out


def pairs(group: Sequence[System], across: bool = False) -> list[tuple[System, System]]:
    """(baseline, system) pairs within one dataset: every system against the first one, except that a pipeline
    from a later file than the first is compared with the first file's pipeline of the same name where that file
    has one (the same pipeline in two configurations; the first file's pipelines are not compared among
    themselves then). ``across``: several files were given, so systems of one file alone are not compared."""
    first = group[0]
    if all(s.source == first.source for s in group):
        return [] if across else [(first, s) for s in group[1:]]
    named = {s.pipeline: s for s in group if s.source == first.source and s.pipeline is not None}
    return [(named.get(s.pipeline, first), s) for s in group if s.source != first.source]


def _is_report(path: Path) -> bool:
    """Whether ``path`` holds an eval report (one JSON document) rather than a run file: its first line, past a
    byte-order mark, opens a JSON object that is not a whole JSONL run record (``{"qid": ..., "hits": [...]}``)."""
    with path.open("rb") as fh:
        first = fh.readline(1 << 20).removeprefix(b"\xef\xbb\xbf").strip()
    if not first.startswith(b"{"):
        return False
    try:
        record = json.loads(first)
    except ValueError:
        return True  # a document that goes on past its first line
    return not (isinstance(record, dict) and "qid" in record and "hits" in record)


def _by_judgements(systems: Sequence[System]) -> dict[str, list[System]]:
    """Systems grouped by what they were scored against: their judgements where recorded (a run file scored
    against `adi/qrels/test.tsv` and a report of ADI's test split alike, whatever their names), else their
    dataset's name (a report from before the digest joins the one set of judgements its name has). Systems of one
    name scored against other judgements are never compared, and a system compared with nothing is said, each
    with a warning."""
    digests: dict[str, set[str]] = {}
    for s in systems:
        if s.judgements is not None:
            digests.setdefault(s.dataset, set()).add(s.judgements)
    groups: dict[str, list[System]] = {}
    names: dict[str, str] = {}  # group key -> the name it is shown by (its first system's dataset)
    for s in systems:
        known = digests.get(s.dataset, set())
        key = s.judgements or (next(iter(known)) if len(known) == 1 else f"name:{s.dataset}")
        groups.setdefault(key, []).append(s)
        names.setdefault(key, s.dataset)
    for name, known in digests.items():
        if len(known) > 1:
            logger.warning("%s: the systems were scored against %d different sets of judgements, each compared only "
                           "within its own", name, len(known))
    shown: dict[str, list[System]] = {}
    for key, group in groups.items():
        label = names[key] if sum(n == names[key] for n in names.values()) == 1 else f"{names[key]} [{key[:8]}]"
        shown[label] = group
        if len(group) == 1:
            logger.warning("%s is compared with nothing: no other system was scored against its judgements (%s)",
                           group[0].label, names[key])
    return shown


def metric_cutoffs(metrics: Sequence[str]) -> list[int]:
    """The default cut-offs and those ``metrics`` name (``NDCG@20`` -> 20): what run files are scored at. A metric
    not of the form NAME@K is a one-line error."""
    from retr.eval.metrics import DEFAULT_K_VALUES, MAX_CUTOFF

    ks = set(DEFAULT_K_VALUES)
    for m in metrics:
        name, _, k = m.partition("@")
        if not name or not k.isdigit() or not 1 <= int(k) <= MAX_CUTOFF:
            raise RetrError(f"metric {m!r}: give NAME@K, e.g. NDCG@10, MAP@100, Recall@1000, P@5, MRR@10")
        ks.add(int(k))
    return sorted(ks)


def _check_ranked(base: System, other: System, dataset: str) -> None:
    """Two run files that ranked other judged queries: none in common is refused (every pair would hold a 0 of a
    missing ranking, trec_eval -c's); some queries ranked by one alone, a warning."""
    if base.ranked is None or other.ranked is None or base.ranked == other.ranked:
        return
    both = base.ranked & other.ranked
    if not both:
        raise RetrError(f"{base.label} and {other.label} ranked no judged query in common on {dataset} "
                        f"({len(base.ranked)} and {len(other.ranked)} others): nothing to pair")
    logger.warning("%s: %s ranked %d judged quer(ies) %s did not, and %d the other way: a missing ranking counts 0 "
                   "(trec_eval -c) in the paired tests", dataset, base.label, len(base.ranked - other.ranked),
                   other.label, len(other.ranked - base.ranked))


def compare(systems: Sequence[System], metrics: Sequence[str] = DEFAULT_METRICS, resamples: int = RESAMPLES,
            seed: int = 0) -> Comparison:
    if not metrics:
        raise RetrError("no metric to compare: give --metrics, e.g. NDCG@10,Recall@100")
    by_dataset = _by_judgements(systems)
    across = len({s.source for s in systems}) > 1
    paired = {dataset: pairs(group, across) for dataset, group in by_dataset.items()}
    if not any(paired.values()):
        raise RetrError("nothing to compare: give at least two systems on the same dataset"
                        + (" in different files" if across else ""))
    unpaired = [d for d, p in paired.items() if not p and len(by_dataset[d]) > 1]
    rows, latency = [], []
    for dataset, group_pairs in paired.items():
        for base, other in group_pairs:
            queries = sorted(set(base.per_query) & set(other.per_query))
            if not queries:
                raise RetrError(f"{base.label} and {other.label} share no scored query on {dataset}")
            _check_ranked(base, other, dataset)
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
                    if base.source == other.source:  # one run: paired queries, one environment
                        diff, lo, hi = bootstrap_ci(la, lb, np.median, resamples, seed)
                    else:
                        diff, lo, hi = float(np.median(lb) - np.median(la)), None, None
                    latency.append(LatencyComparison(dataset, base.label, other.label, len(lq), float(np.median(la)),
                                                     float(np.median(lb)), diff, lo, hi))
    p_t_holm = holm([r["p_t"] for r in rows])
    p_r_holm = holm([r["p_randomization"] for r in rows])
    out = [MetricComparison(**r, p_t_holm=pt, p_randomization_holm=pr)
           for r, pt, pr in zip(rows, p_t_holm, p_r_holm, strict=True)]
    return Comparison(out, latency, resamples, seed, unpaired)


def comparison_table(c: Comparison, alpha: float = 0.05) -> str:
    from retr.eval.table import grid

    header = ["dataset", "metric", "baseline", "system", "n", "base", "sys", "diff", "p (t)", "p (rand)",
              "p Holm (t/rand)", "W/T/L", f"both<{alpha:g}"]
    rows = []
    for r in c.metrics:
        mark = "*" if r.p_randomization_holm < alpha and r.p_t_holm < alpha else ""
        rows.append([r.dataset, r.metric, r.baseline, r.system, str(r.queries), f"{r.baseline_mean:.4f}",
                     f"{r.system_mean:.4f}", f"{r.difference:+.4f}", f"{r.p_t:.4g}", f"{r.p_randomization:.4g}",
                     f"{r.p_t_holm:.3g}/{r.p_randomization_holm:.3g}", f"{r.wins}/{r.ties}/{r.losses}", mark])
    text = grid(header, rows)
    text += (f"\n* both corrected p-values < {alpha} (Holm-Bonferroni over all {len(c.metrics)} comparisons; "
             f"randomization: {c.resamples} seeded resamples, or exact)")
    if c.unpaired:
        text += f"\nnot compared (in one file only): {', '.join(c.unpaired)}"
    if c.latency:
        lat = [[x.dataset, x.baseline, x.system, str(x.queries), f"{x.baseline_p50_ms:.2f}", f"{x.system_p50_ms:.2f}",
                f"{x.difference_ms:+.2f}",
                "other run" if x.ci_low_ms is None else f"[{x.ci_low_ms:+.2f}, {x.ci_high_ms:+.2f}]"]
               for x in c.latency]
        text += "\n\n" + grid(["dataset", "baseline", "system", "n", "base p50 ms", "sys p50 ms", "diff ms",
                               "95% bootstrap CI"], lat)
        if any(x.ci_low_ms is None for x in c.latency):
            text += ("\nother run: latency measured in different runs (another process, load or machine) is shown, "
                     "never tested")
    return text


def write_comparison(c: Comparison, path: Path) -> None:
    from retr.retrieval.artifacts import atomic_write_text

    atomic_write_text(Path(path), json.dumps(c.to_dict(), indent=2) + "\n", output=True)
