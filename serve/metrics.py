"""The service's counters and latency histograms, rendered as Prometheus text (``GET /metrics``)."""

from __future__ import annotations

import bisect
import threading
from collections import Counter, defaultdict

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def family(name: str, kind: str, help: str, samples) -> list[str]:
    """One metric family's lines: ``samples`` as ``(labels, value)`` pairs, or one value without labels."""
    if not isinstance(samples, list):
        samples = [("", samples)]
    return [f"# HELP {name} {help}", f"# TYPE {name} {kind}",
            *(f"{name}{'{' + labels + '}' if labels else ''} {value}" for labels, value in samples)]


class Metrics:
    """Requests by path and status, and search latency per stage."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.hist: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
        self.sums: Counter[str] = Counter()

    def request(self, path: str, status: int) -> None:
        with self._lock:
            self.requests[(path, status)] += 1

    def observe(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.hist[stage][bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            self.sums[stage] += seconds

    def observe_results(self, results) -> None:
        """Every stage latency of ``results`` (search results with ``latency_ms``)."""
        for r in results:
            for stage, ms in r.latency_ms.items():
                self.observe(stage, ms / 1000.0)

    def render(self, generations, searches_on: dict[str, int], connections) -> str:
        """The text of ``GET /metrics``; ``generations``: the served generation (``Generations``),
        ``connections``: what the connection guard did (``retr.serve.guard.ConnectionCounts``)."""
        with self._lock:
            errors = sum(n for (_, status), n in self.requests.items() if status >= 400)
            buckets = []
            for stage, counts in sorted(self.hist.items()):
                cum = 0
                for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=True):
                    cum += n
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    buckets.append(f'retr_stage_latency_seconds_bucket{{stage="{stage}",le="{le}"}} {cum}')
                buckets += [f'retr_stage_latency_seconds_sum{{stage="{stage}"}} {self.sums[stage]!r}',
                            f'retr_stage_latency_seconds_count{{stage="{stage}"}} {cum}']
            lines = [*family("retr_requests_total", "counter", "HTTP requests by path and status.",
                             [(f'path="{p}",status="{s}"', n) for (p, s), n in sorted(self.requests.items())]),
                     *family("retr_request_errors_total", "counter", "HTTP requests answered with a 4xx or 5xx.",
                             errors),
                     *family("retr_stage_latency_seconds", "histogram", "Search latency per pipeline stage.", []),
                     *buckets]
        lines += family("retr_index_generation", "gauge",
                        "Generation of the index folder being served (its manifest's).", generations.number)
        lines += family("retr_index_generations_opened", "counter", "Generations this server has opened.",
                        generations.opened)
        lines += family("retr_index_refused", "gauge", "1 while a newer generation on disk is refused and the last "
                        "good one is served.", int(generations.refused is not None))
        lines += family("retr_connections_refused_total", "counter",
                        "Connections answered 503 and closed: over --max-connections.", connections.refused)
        lines += family("retr_read_timeouts_total", "counter", "Requests (or idle new connections) closed because "
                        "they did not arrive within --timeout.", connections.timed_out)
        lines += family("retr_searches_total", "counter", "Searches by the thread they ran on: the event loop's "
                        "(one query without reranking from a lone client) or the search threads.",
                        [(f'on="{on}"', n) for on, n in searches_on.items()])
        return "\n".join(lines) + "\n"
