"""The fusion stage: any number of pipelines run to the fusion depth, their lists fused (``retr.retrieval.fusion``).

``fuse(bm25,dense)`` (``hybrid``) is the two-list case; ``fuse(bm25,bm25+rm3,dense)`` fuses three. ``method``
(``minmax``, ``zscore``, ``rrf``) is the fusion; without one, the searcher's (``PipelineConfig.fusion``). Lists are
fused in the order written (with min-max and z-score, each list weighs 1/n).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retr.retrieval.fusion import DEFAULT_FUSION, FUSIONS
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.stage import Option, Stage
from retr.retrieval.types import Run


class FusedRetriever:
    """Runs each of ``parts`` to ``max(k, depth)`` and fuses their rankings with ``fusion``."""

    def __init__(self, parts: Sequence[Retriever], fusion: str = DEFAULT_FUSION, depth: int = 100, rrf_k: int = 60,
                 weights: Sequence[float] | None = None, name: str = "fuse"):
        self.parts = tuple(parts)
        self.fusion, self.depth, self.rrf_k, self.weights = fusion, depth, rrf_k, weights
        self.name = name
        self.stages = tuple(dict.fromkeys([s for p in self.parts for s in p.stages] + ["fusion"]))

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        depth = max(k, self.depth)
        runs = [p.search(queries, depth, timer) for p in self.parts]
        with timer.stage("fusion"):
            return FUSIONS[self.fusion](runs, k, self.rrf_k, self.weights, self.depth)


def _build(ctx, node, inputs: Sequence[Retriever]) -> Retriever:
    cfg = ctx.config
    return FusedRetriever(inputs, node.option("method") or cfg.fusion, cfg.fusion_depth, cfg.rrf_k, name=str(node))


STAGE = Stage("fuse", "combine", _build, "fuse the ranked lists of two or more pipelines",
              options={"method": Option(None, str, choices=tuple(FUSIONS))})
