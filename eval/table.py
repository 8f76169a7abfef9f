"""Plain-text tables for `retr eval` reports."""

from __future__ import annotations

import math

from retr.eval.metrics import headline_cutoff
from retr.eval.report import EvalReport

STAGE_ORDER = ("encode", "ann", "bm25", "fusion", "rerank")


def _fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def headline_metrics(k_values: list[int]) -> list[str]:
    cut = headline_cutoff(k_values)
    deep = [k for k in (100, 1000) if k in k_values] or [max(k_values)]
    return [f"NDCG@{cut}", f"MAP@{cut}", *(f"Recall@{k}" for k in deep), f"P@{cut}", "MRR@10"]


def main_table(report: EvalReport) -> str:
    metrics = headline_metrics(report.k_values)
    if "runs" in report.config:  # runs made elsewhere, scored against a qrels file: no latency, no index
        scored = next(iter(report.pipelines.values())).num_queries_scored if report.pipelines else 0
        title = (f"runs scored against {report.dataset.path}: {scored} judged quer{'y' if scored == 1 else 'ies'} "
                 "(made elsewhere: no latency measured)")
        return title + "\n" + grid(["run", *metrics], [[name, *(_fmt(p.metrics[m]) for m in metrics)]
                                                         for name, p in report.pipelines.items()])
    stages = [s for s in STAGE_ORDER if any(s in p.latency_ms for p in report.pipelines.values())]
    header = ["pipeline", *metrics, "p50 ms", "p95 ms", "p99 ms", "QPS",
              *(f"{s} p50" for s in stages), "build s", "docs/s", "index MB"]
    rows = []
    for name, p in report.pipelines.items():
        total = p.latency_ms["total"]
        rows.append([
            name, *(_fmt(p.metrics[m]) for m in metrics),
            _fmt(total.p50, 2), _fmt(total.p95, 2), _fmt(total.p99, 2),
            _fmt(p.qps, 1), *(_fmt(p.latency_ms[s].p50, 2) if s in p.latency_ms else "-" for s in stages),
            _fmt(p.build_seconds, 1), _fmt(p.docs_per_second, 1), _fmt(p.index_bytes / 1e6, 2),
        ])
    d = report.dataset
    scored = next(iter(report.pipelines.values())).num_queries_scored if report.pipelines else 0
    title = f"{d.name} ({d.split}): {d.num_docs} docs, {scored} queries scored; latency per single warm query"
    return title + truncation_line(report.index.get("manifest", {}).get("dense") or {}) + reranker_line(report.reranker) \
        + "\n" + grid(header, rows)


def reranker_line(reranker: dict | None) -> str:
    """The cross-encoder's weight on this corpus and why ('' without a reranker, or for a report from before)."""
    if not reranker or "weight_source" not in reranker:
        return ""
    line = f"\nreranker weight {reranker['weight']:.1f} ({reranker['weight_source']})"
    check = reranker.get("corpus_check")
    if check:
        chosen = f"{check['weight']:.1f}"
        line += (f": trained on another corpus; on {check['queries']} pseudo-queries cut from this one, nDCG@10 "
                 f"{check['curve']['0.0']:.4f} without it, {check['curve'][chosen]:.4f} at {chosen} (chosen)"
                 + ("; not run here" if reranker["weight"] <= 0 else ""))
        line += gain_bound_text(check)
    if "inputs" in reranker:
        line += f"; reads {reranker['inputs']} documents, {reranker['max_length']} tokens"
    return line


def gain_bound_text(check: dict) -> str:
    """The gain the curve's best weight showed and the bound that decided whether it was taken ('' for a check
    stored before the bound, or a curve whose best is the first stage alone)."""
    from retr.retrieval.rerank import rule_weight

    low = check.get("gain_low")
    best = f"{rule_weight(check['curve']):.1f}"
    if not low or best == "0.0":
        return ""
    gain = check["curve"][best] - check["curve"]["0.0"]
    return (f"; best weight {best}: gain {gain:+.4f}, 95% bootstrap lower bound {low[best]:+.4f}"
            + ("" if check["weight"] > 0 else " (not reliable: not taken)"))


def truncation_line(dense: dict) -> str:
    """What the dense side never saw, as the index recorded it ('' for an index from before it did)."""
    t = dense.get("truncation")
    if not t:
        return ""
    unit = "passages" if dense.get("passages") else "documents"
    parts = f"; as {dense['passages']['count']} passages of <= {dense['passages']['size']} tokens " \
            f"({dense['passages']['aggregate']})" if dense.get("passages") else ""
    return (f"\ntruncated at {t['max_length']} tokens: {t['truncated']} of {t['texts']} {unit} "
            f"({100 * t['share_truncated']:.1f}%), {100 * t['share_tokens_dropped']:.1f}% of tokens dropped{parts}")


def detail_table(report: EvalReport) -> str:
    ks = report.k_values
    header = ["pipeline", "metric", *(f"@{k}" for k in ks)]
    rows = []
    for name, p in report.pipelines.items():
        for m in ("NDCG", "MAP", "Recall", "P"):
            rows.append([name, m, *(_fmt(p.metrics[f"{m}@{k}"]) for k in ks)])
    return grid(header, rows)


def summary_table(reports: list[EvalReport]) -> str:
    """Across datasets: nDCG@10 and Recall@100 per pipeline x dataset with their means, then each stage's p50
    latency per pipeline, averaged over the datasets."""
    names = [r.dataset.name for r in reports]
    pipelines = list(dict.fromkeys(p for r in reports for p in r.pipelines))
    blocks = []
    for metric in ("NDCG@10", "Recall@100"):
        rows = []
        for p in pipelines:
            values = [r.pipelines[p].metrics.get(metric) if p in r.pipelines else None for r in reports]
            have = [v for v in values if v is not None]
            mean = sum(have) / len(have) if len(have) == len(values) else None
            rows.append([p, *(_fmt(v) for v in values), _fmt(mean)])
        blocks.append(f"{metric} across {len(reports)} datasets\n" + grid(["pipeline", *names, "mean"], rows))
    stages = [s for s in (*STAGE_ORDER, "total") if any(s in p.latency_ms for r in reports for p in r.pipelines.values())]
    rows = []
    for p in pipelines:
        cells = []
        for s in stages:
            ms = [r.pipelines[p].latency_ms[s].p50 for r in reports if p in r.pipelines and s in r.pipelines[p].latency_ms]
            cells.append(_fmt(sum(ms) / len(ms), 2) if ms else "-")
        rows.append([p, *cells])
    blocks.append("p50 latency (ms) per stage, mean over datasets\n" + grid(["pipeline", *stages], rows))
    return "\n\n".join(blocks)
