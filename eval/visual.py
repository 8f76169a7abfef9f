"""One self-contained HTML page from eval reports: the summary table, quality against latency with the Pareto front
marked, Recall@k curves, and per-query nDCG@10 differences, sorted: the default pipeline (hybrid) against each
other one, or the two pipelines asked for. Figures are drawn with
matplotlib (Agg, chosen here, never at import) and embedded as PNG data URIs: the file needs nothing beside it.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from retr.eval.report import EvalReport, read_reports
from retr.retrieval import defaults
from retr.retrieval.errors import RetrError


@dataclass(frozen=True)
class Entry:
    """One pipeline of one report: what every figure plots."""
    label: str
    dataset: str
    report: EvalReport
    pipeline: str

    @property
    def result(self):
        return self.report.pipelines[self.pipeline]


def entries_from(paths: Sequence[str | Path]) -> list[Entry]:
    loaded = [(Path(p), read_reports(p)) for p in paths]
    many_files = len(loaded) > 1
    out = []
    for path, reports in loaded:
        for r in reports:
            for name in r.pipelines:
                out.append(Entry(f"{path.stem}:{name}" if many_files else name, r.dataset.name, r, name))
    if not out:
        raise RetrError("the reports hold no pipeline")
    return out


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower x = latency, higher y = quality), by x."""
    front = [i for i, (x, y) in enumerate(points)
             if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for x2, y2 in points)]
    return sorted(front, key=lambda i: points[i][0])


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _by_dataset(entries: Sequence[Entry]) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {}
    for e in entries:
        out.setdefault(e.dataset, []).append(e)
    return out


def _grid(n: int):
    """A figure with ``n`` panels, at most three a row (unused ones hidden), and the panels in order."""
    import matplotlib.pyplot as plt

    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _log_x(ax) -> None:
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def quality_latency_figure(entries: Sequence[Entry], metric: str = "NDCG@10") -> str:
    groups = _by_dataset(entries)
    fig, axes = _grid(len(groups))
    for ax, (dataset, group) in zip(axes, groups.items(), strict=True):
        pts = [(e.result.latency_ms["total"].p50, e.result.metrics[metric]) for e in group]
        front = pareto(pts)
        for i, (e, (x, y)) in enumerate(zip(group, pts, strict=True)):
            ax.scatter([x], [y], s=40, color="C3" if i in front else "C0", zorder=3)
            ax.annotate(e.label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="C3", lw=1, label="Pareto front")
        _log_x(ax)
        ax.margins(x=0.25, y=0.15)
        ax.set_xlabel("p50 latency per query (ms, log)")
        ax.set_ylabel(metric)
        ax.set_title(dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _png(fig)


def recall_figure(entries: Sequence[Entry]) -> str:
    groups = _by_dataset(entries)
    fig, axes = _grid(len(groups))
    for ax, (dataset, group) in zip(axes, groups.items(), strict=True):
        for e in group:
            ks = sorted(e.report.k_values)
            ax.plot(ks, [e.result.metrics[f"Recall@{k}"] for k in ks], marker="o", ms=3, label=e.label)
        _log_x(ax)
        ax.set_xlabel("k (log)")
        ax.set_ylabel("Recall@k")
        ax.set_title(dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def delta_figure(a: Entry, b: Entry, metric: str = "NDCG@10") -> tuple[str, dict]:
    """Per-query ``metric`` of ``b`` minus ``a`` on the queries both scored, sorted; and its counts."""
    import matplotlib.pyplot as plt

    queries = sorted(set(a.result.per_query) & set(b.result.per_query))
    deltas = sorted(b.result.per_query[q][metric] - a.result.per_query[q][metric] for q in queries)
    fig, ax = plt.subplots(figsize=(8.4, 3.2))
    colors = ["C2" if d > 0 else "C3" if d < 0 else "0.6" for d in deltas]
    ax.bar(range(len(deltas)), deltas, width=1.0, color=colors)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xlabel(f"queries, sorted ({len(deltas)})")
    ax.set_ylabel(f"{metric}: {b.label} - {a.label}")
    ax.set_title(a.dataset)
    ax.grid(alpha=0.3, axis="y")
    counts = {"wins": sum(d > 0 for d in deltas), "ties": sum(d == 0 for d in deltas),
              "losses": sum(d < 0 for d in deltas), "mean": sum(deltas) / len(deltas) if deltas else 0.0}
    return _png(fig), counts


def _pairs(entries: Sequence[Entry], dataset: str, pair: tuple[str, str] | None) -> list[tuple[Entry, Entry]]:
    """The (A, B) whose per-query differences B - A are drawn: ``pair``; by default the default pipeline (hybrid)
    against each other one, or the first two where no pipeline is the default one."""
    group = [e for e in entries if e.dataset == dataset]
    if pair is None:
        main = next((e for e in group if e.pipeline == defaults.MODE), None)
        if main is None:
            return [(group[0], group[1])] if len(group) > 1 else []
        return [(e, main) for e in group if e is not main]
    found = [next((e for e in group if e.label == name or e.pipeline == name), None) for name in pair]
    if None in found:
        have = ", ".join(e.label for e in group)
        raise RetrError(f"--pair {pair[0]} {pair[1]}: not both on {dataset} (pipelines there: {have})")
    return [(found[0], found[1])]


def _shown(x, digits: int) -> str:
    """A figure of the summary table, '-' where there is none (a run made elsewhere has no latency)."""
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _timed(e: Entry) -> bool:
    """Whether ``e``'s latency was measured (``retr eval --run`` scores runs made elsewhere: none)."""
    p50 = e.result.latency_ms["total"].p50
    return p50 is not None and math.isfinite(p50) and p50 > 0


def render(entries: Sequence[Entry], pair: tuple[str, str] | None = None, title: str = "retr report") -> str:
    esc = html.escape
    datasets = list(_by_dataset(entries))
    rows = []
    for e in entries:
        m, lat = e.result.metrics, e.result.latency_ms["total"]
        rows.append(f"<tr><td>{esc(e.dataset)}</td><td>{esc(e.label)}</td><td>{_shown(m.get('NDCG@10'), 4)}</td>"
                    f"<td>{_shown(m.get('Recall@100'), 4)}</td><td>{_shown(lat.p50, 2)}</td>"
                    f"<td>{_shown(lat.p95, 2)}</td><td>{_shown(e.result.qps, 1)}</td></tr>")
    timed = [e for e in entries if _timed(e)]
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title><style>"
             "body{font-family:system-ui,sans-serif;max-width:75rem;margin:2rem auto;padding:0 1rem;color:#222}"
             "table{border-collapse:collapse}td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:right}"
             "td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}img{max-width:100%}"
             f"</style></head><body><h1>{esc(title)}</h1>",
             "<h2>Summary</h2><table id=summary><tr><th>dataset</th><th>pipeline</th><th>nDCG@10</th>"
             "<th>Recall@100</th><th>p50 ms</th><th>p95 ms</th><th>QPS</th></tr>" + "".join(rows) + "</table>",
             "<h2>Quality against latency</h2>" + (
                 "<p>Red: the Pareto front (no other pipeline is both faster and better).</p>"
                 f'<img id=pareto alt="nDCG@10 against p50 latency" src="{quality_latency_figure(timed)}">'
                 if timed and all("NDCG@10" in e.result.metrics for e in timed)
                 else "<p>No latency was measured (runs made elsewhere, scored by <code>retr eval --run</code>), "
                      "or no nDCG@10.</p>"),
             "<h2>Recall@k</h2>", f'<img id=recall alt="Recall at each k" src="{recall_figure(entries)}">']
    deltas = []
    for d in datasets:
        for chosen in _pairs(entries, d, pair):
            img, c = delta_figure(*chosen)
            deltas.append(f"<h3>{esc(d)}: {esc(chosen[1].label)} against {esc(chosen[0].label)}</h3>"
                          f"<p>{c['wins']} queries better, {c['ties']} equal, {c['losses']} worse; mean "
                          f"{c['mean']:+.4f}</p><img class=delta alt=\"per-query differences\" src=\"{img}\">")
    if deltas:
        parts.append("<h2>Per-query nDCG@10 differences</h2>" + "".join(deltas))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(paths: Sequence[str | Path], out: str | Path, pair: tuple[str, str] | None = None) -> int:
    """Render the reports at ``paths`` into ``out`` (written atomically); the number of figures."""
    import matplotlib

    from retr.retrieval.artifacts import atomic_write_text

    matplotlib.use("Agg", force=True)
    page = render(entries_from(paths), pair, title=f"retr report: {', '.join(Path(p).name for p in paths)}")
    atomic_write_text(Path(out), page, output=True)
    return page.count("data:image/png;base64,")
