"""The cut-off stage: ``X%n`` (``X % n`` in Python) keeps pipeline X's top ``n`` hits."""

from __future__ import annotations

from collections.abc import Mapping

from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.stage import Option, Stage
from retr.retrieval.types import Run


class CutRetriever:
    """``inner`` asked for at most ``depth`` hits, whatever depth its caller asks for."""

    def __init__(self, inner: Retriever, depth: int, name: str):
        self.inner, self.depth, self.name = inner, depth, name
        self.stages = inner.stages

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        return self.inner.search(queries, min(k, self.depth), timer)


STAGE = Stage("cut", "step", lambda ctx, node, inputs: CutRetriever(inputs[0], node.option("depth"), str(node)),
              "keep a pipeline's top n hits (X%n)", options={"depth": Option(1000, int, low=1)})
