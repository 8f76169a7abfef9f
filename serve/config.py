"""What a server is allowed to do (``ServeConfig``) and which ``Host`` names it answers."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import PipelineConfig
from retr.retrieval.request import MAX_K
from retr.retrieval.rerank import RerankConfig

LOOPBACK_HOSTS = frozenset(("localhost", "127.0.0.1", "::1"))


@dataclass(frozen=True)
class ServeConfig:
    max_query_chars: int = 2000
    max_k: int = 1000
    max_batch: int = 64
    max_body_bytes: int = 1 << 20
    # searches in flight at once, each on a thread of its own (default: the cores, at most 4): with one-thread
    # query graphs, one search per core
    search_threads: int = 0
    # seconds a search may take, and a request may take to arrive (headers and body, from its first byte)
    timeout_s: float = 30.0
    # open connections at once; one more is answered 503 and closed as it is accepted
    max_connections: int = 128
    # Host names served besides the loopback ones (DNS rebinding: a page's own name pointed at 127.0.0.1)
    allowed_hosts: tuple[str, ...] = ()
    encoder: EncoderConfig = EncoderConfig()
    pipeline: PipelineConfig = PipelineConfig()
    rerank: RerankConfig | None = None

    def __post_init__(self):
        if not (isinstance(self.timeout_s, int | float) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise RetrError(f"timeout must be a number of seconds > 0, got {self.timeout_s!r}")
        for name in ("max_query_chars", "max_k", "max_batch", "max_body_bytes", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RetrError(f"{name} must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "allowed_hosts", tuple(host_name(h) for h in self.allowed_hosts))
        if self.pipeline.fusion_depth > min(self.max_k, MAX_K):  # the bound a request's own depth meets
            raise RetrError(f"fusion depth {self.pipeline.fusion_depth} is over this server's max k "
                            f"({min(self.max_k, MAX_K)}): give at most that, or raise --max-k")

    @property
    def hosts(self) -> frozenset[str]:
        """Every Host name this server answers."""
        return LOOPBACK_HOSTS | frozenset(self.allowed_hosts)


def host_name(value: str) -> str:
    """The name in a ``Host`` header value or an ``--allow-host`` argument, lowercased, without its port, IPv6
    brackets or a final dot: ``[::1]:8000`` -> ``::1``, ``LocalHost.:80`` -> ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
