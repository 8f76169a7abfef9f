"""Where an index's documents are encoded: in this process (``local``) or on a Ray cluster (``ray``).

Both run the same plan (``BiEncoder.corpus_plan``: the verified graph, calibrated where it applies, and the
documents' token ids) in the same length-sorted batches under the same token budget, so that a batch's input is
byte for byte the one a local build feeds its graph. One registry: ``EXECUTORS[name]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from retr.indexes.ray_encode import encode_on_ray  # imports Ray only when it runs
from retr.retrieval import defaults
from retr.retrieval.encoder import BiEncoder, CorpusEncoding
from retr.retrieval.errors import RetrError


@dataclass(frozen=True)
class ExecutorConfig:
    name: str = defaults.EXECUTOR  # a key of EXECUTORS
    # ray: the cluster to join ("auto", or HOST:PORT of its head); None: a Ray started on this machine for the build
    address: str | None = None
    actors: int = defaults.RAY_ACTORS  # ray: encoder actors (each loads the graph once)
    cpus_per_actor: int = 1  # ray: CPUs each actor reserves; its inference threads
    batches_per_task: int = 4  # ray: encoding batches per Ray Data batch (a task to an actor)

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise RetrError(f"unknown executor {self.name!r}: choose one of {', '.join(EXECUTORS)}")
        for field_, value in (("actors", self.actors), ("cpus_per_actor", self.cpus_per_actor),
                              ("batches_per_task", self.batches_per_task)):
            if value < 1:
                raise RetrError(f"executor {field_} must be >= 1, got {value}")


def encode_local(encoder: BiEncoder, texts: list[str], cfg: ExecutorConfig) -> CorpusEncoding:
    return encoder.encode_corpus(texts, show_progress=True)


def encode_ray(encoder: BiEncoder, texts: list[str], cfg: ExecutorConfig) -> CorpusEncoding:
    return encode_on_ray(encoder, texts, address=cfg.address, actors=cfg.actors, cpus_per_actor=cfg.cpus_per_actor,
                         batches_per_task=cfg.batches_per_task)


EXECUTORS: dict[str, Callable[[BiEncoder, list[str], ExecutorConfig], CorpusEncoding]] = {
    "local": encode_local,
    "ray": encode_ray,
}
