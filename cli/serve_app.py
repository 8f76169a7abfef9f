"""The HTTP service behind `retr serve`: FastAPI over one index folder, on the same Searcher as `retr search`.

Endpoints: ``POST /search`` (one query or a batch; the JSON of `retr search --json`), ``GET /search?q=...``
(one query, its options as parameters, checked as the POST body is), ``GET /doc/{id}``,
``GET /healthz``, ``GET /metrics`` (Prometheus text), ``GET /`` (a search page whose URL holds the query:
``/?q=...&mode=...&k=...``), OpenAPI at ``/docs``.
Every input is bounded (query length, k, batch size, body size, time per request); a bad request gets a 4xx
with a JSON error. Safe on a laptop: only the loopback names (and ``--allow-host`` names) are served as ``Host``
(no DNS rebinding), a body is JSON by content type (no cross-site simple POST), a request must arrive whole within
the timeout (headers and body: a stalled client is answered 408 and closed) and the open connections are capped
(``--max-connections``: the file descriptors held are bounded). Searches run in a worker thread (the event loop
never blocks on them; ``Dispatch`` says when a lone client's brief query runs on the loop's thread instead) and
share one loaded index and encoder. When the folder is rebuilt or replaced (atomic rename), the next request opens
the new generation; requests already running finish on the one they started with; a new generation that does not
open is refused and the last good one stays served (``/healthz`` says so).
"""

# no `from __future__ import annotations`: FastAPI reads the endpoint's request model (a class made per app, with
# this server's bounds) from the evaluated annotation
import asyncio
import bisect
import html
import ipaddress
import json
import logging
import math
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from retr.eval.pseudo import check_index_reranker
from retr.indexes.searcher import Searcher
from retr.retrieval.artifacts import read_small
from retr.retrieval.backends.runners import default_threads
from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import DamagedPart
from retr.retrieval.options import http_model
from retr.retrieval.pipeline import FIRST_STAGES, PipelineConfig
from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE, MAX_K, SearchRequest
from retr.retrieval.rerank import RerankConfig

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOPBACK_HOSTS = frozenset(("localhost", "127.0.0.1", "::1"))
# a refused generation whose manifest has not changed is tried again after this long (a part repaired in place)
RETRY_REFUSED_S = 5.0
# statuses of requests that got no answer from the app: the client left mid-request (nginx's 499), or its request
# did not arrive whole within the timeout (408, written by the connection's guard)
CLIENT_CLOSED, READ_TIMEOUT = 499, 408


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


def manifest_generation(index) -> int:
    """The generation an opened index says it is (its manifest's count of changes: 0 for a fresh build)."""
    generation = getattr(index, "generation", None)
    if generation is None:
        generation = index.manifest.generation
    return int(generation)


@dataclass(frozen=True)
class Refusal:
    """A generation on disk that did not open: the last good one is served meanwhile."""
    generation: int | None  # the refused manifest's, where it could be read
    error: str
    since: float  # time.time() of the first refusal of this manifest

    def to_dict(self) -> dict:
        return {"generation": self.generation, "error": self.error, "since": self.since}


def _generation_on_disk(folder: Path) -> int | None:
    try:
        manifest = json.loads(read_small(folder / "manifest.json"))  # never a FIFO or device: it would hang
        return int(manifest.get("generation", 0))
    except (OSError, ValueError, TypeError, AttributeError, RetrError):
        return None


class Generations:
    """The Searcher of the folder's current generation: reopened when its manifest is replaced. A new generation
    is opened and its parts loaded (a hybrid search) before it is served; one that fails is refused, logged once,
    and the last good one stays served (tried again when the manifest changes, or after ``RETRY_REFUSED_S``). The
    first open's error is the caller's: a server never starts on a damaged folder."""

    def __init__(self, folder: Path, cfg: ServeConfig):
        self.folder = Path(folder)
        self.cfg = cfg
        self._lock = threading.Lock()
        self.opened = 0  # generations this server has opened
        self.refused: Refusal | None = None
        self._refused_stamp = None
        self._retry_at = 0.0
        self._stamp = None
        self._searcher: Searcher | None = None
        self.current()

    @property
    def number(self) -> int:
        """The served generation, as its manifest says."""
        return manifest_generation(self._searcher.index)

    def _manifest_stamp(self):
        st = os.stat(self.folder / "manifest.json")
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _open(self) -> Searcher:
        if self._searcher is None:
            searcher = Searcher(self.folder, self.cfg.encoder, self.cfg.pipeline, self.cfg.rerank)
        else:
            searcher = self._searcher.reopened()
        try:
            # every part loaded now, from this generation, not by the first request that needs it
            searcher.search_many(["retr"], 1, "hybrid" if searcher.index.has_bm25 else "dense")
            if self.cfg.rerank is not None:  # loaded before any request waits on it; the first generation's is
                # checked on this corpus once, here (the check stored beside the index read, or one measured and
                # stored there); a new generation reads the stored one, or carries the last one over
                reranker = searcher.reranker(self.cfg.rerank.model)
                if self._searcher is None and searcher.check_applies(reranker):
                    check_index_reranker(searcher.index, searcher.encoder, reranker, self.cfg.pipeline)
        except BaseException:
            searcher.close()
            raise
        return searcher

    def current(self) -> Searcher:
        try:
            stamp = self._manifest_stamp()
        except OSError:
            stamp = None  # mid-swap or removed: keep serving the generation we have
        with self._lock:
            if self._searcher is None:
                self._searcher, self._stamp = self._open(), stamp
                self.opened = 1
            elif stamp is not None and stamp != self._stamp and \
                    (stamp != self._refused_stamp or time.monotonic() >= self._retry_at):
                self._reopen(stamp)
            return self._searcher

    def _reopen(self, stamp) -> None:
        try:
            searcher = self._open()
        except Exception as e:  # noqa: BLE001 - whatever stops the new generation, the last good one is served
            message = str(e) if isinstance(e, RetrError) else f"{type(e).__name__}: {e}"
            if stamp != self._refused_stamp:
                logger.warning("%s: a new generation on disk was refused, generation %d is still served: %s",
                               self.folder, self.number, message)
                self.refused = Refusal(_generation_on_disk(self.folder), message, time.time())
                self._refused_stamp = stamp
            self._retry_at = time.monotonic() + RETRY_REFUSED_S
            return
        self._searcher, self._stamp = searcher, stamp
        self.opened += 1
        self.refused, self._refused_stamp = None, None
        logger.info("%s changed: generation %d opened", self.folder, self.number)


class Dispatch:
    """Where a search runs. On the pool's threads, so that the event loop never waits on a search and concurrent
    searches run side by side; except brief work (one query, no reranking) while the server holds only the
    connection it came on and no other search is in flight: no other request can then be waiting for the loop, so
    the query runs on the loop's own thread and saves the two thread hand-offs (about 0.25 ms of the HTTP overhead
    at one client on 2 cores, measured with ``benchmarks/serve_load.py``: README, "Service"). A connection that opens meanwhile waits at
    most that one first-stage search (a hybrid SciFact query: ~10 ms). ``open_connections``: the ASGI server's
    count of open connections (uvicorn's server state, see ``uvicorn_server``); None where unknown, and then every
    search takes the pool. Batches and reranked queries, which may run long, always take the pool, where the
    request's deadline is kept."""

    def __init__(self, pool: ThreadPoolExecutor, timeout_s: float, open_connections: Callable[[], int] | None = None):
        self.pool = pool
        self.timeout_s = timeout_s
        self.open_connections = open_connections
        self.in_flight = 0  # searches on the pool (read and written on the event loop's thread only)
        self.inline = self.pooled = 0  # searches run on the loop and on the pool (/metrics: retr_searches_total)

    async def run(self, fn: Callable, *args, brief: bool):
        if brief and not self.in_flight and self.open_connections is not None and self.open_connections() <= 1:
            self.inline += 1
            return fn(*args)
        self.in_flight += 1
        self.pooled += 1
        try:
            async with asyncio.timeout(self.timeout_s):  # no task of its own, unlike wait_for
                return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        finally:
            self.in_flight -= 1


class Metrics:
    """Counters and latency histograms, rendered as Prometheus text."""

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
            counts = self.hist[stage]
            counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            self.sums[stage] += seconds

    def observe_results(self, results) -> None:
        """Every stage latency of ``results`` (search results with ``latency_ms``)."""
        for r in results:
            for stage, ms in r.latency_ms.items():
                self.observe(stage, ms / 1000.0)

    def render(self, generations: "Generations", searches_on: dict[str, int] | None = None,
               connections: "ConnectionCounts | None" = None) -> str:
        with self._lock:
            lines = ["# HELP retr_requests_total HTTP requests by path and status.",
                     "# TYPE retr_requests_total counter"]
            for (path, status), n in sorted(self.requests.items()):
                lines.append(f'retr_requests_total{{path="{path}",status="{status}"}} {n}')
            errors = sum(n for (_, status), n in self.requests.items() if status >= 400)
            lines += ["# HELP retr_request_errors_total HTTP requests answered with a 4xx or 5xx.",
                      "# TYPE retr_request_errors_total counter", f"retr_request_errors_total {errors}",
                      "# HELP retr_stage_latency_seconds Search latency per pipeline stage.",
                      "# TYPE retr_stage_latency_seconds histogram"]
            for stage, counts in sorted(self.hist.items()):
                cum = 0
                for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=True):
                    cum += n
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    lines.append(f'retr_stage_latency_seconds_bucket{{stage="{stage}",le="{le}"}} {cum}')
                lines.append(f'retr_stage_latency_seconds_sum{{stage="{stage}"}} {self.sums[stage]!r}')
                lines.append(f'retr_stage_latency_seconds_count{{stage="{stage}"}} {cum}')
            refused = generations.refused
            lines += ["# HELP retr_index_generation Generation of the index folder being served (its manifest's).",
                      "# TYPE retr_index_generation gauge", f"retr_index_generation {generations.number}",
                      "# HELP retr_index_generations_opened Generations this server has opened.",
                      "# TYPE retr_index_generations_opened counter",
                      f"retr_index_generations_opened {generations.opened}",
                      "# HELP retr_index_refused 1 while a newer generation on disk is refused and the last good "
                      "one is served.", "# TYPE retr_index_refused gauge",
                      f"retr_index_refused {0 if refused is None else 1}"]
            if connections is not None:
                lines += ["# HELP retr_connections_refused_total Connections answered 503 and closed: over "
                          "--max-connections.", "# TYPE retr_connections_refused_total counter",
                          f"retr_connections_refused_total {connections.refused}",
                          "# HELP retr_read_timeouts_total Requests (or idle new connections) closed because "
                          "they did not arrive within --timeout.", "# TYPE retr_read_timeouts_total counter",
                          f"retr_read_timeouts_total {connections.timed_out}"]
            if searches_on is not None:
                lines += ["# HELP retr_searches_total Searches by the thread they ran on: the event loop's (one "
                          "query without reranking from a lone client) or the search threads.",
                          "# TYPE retr_searches_total counter"]
                lines += [f'retr_searches_total{{on="{on}"}} {n}' for on, n in searches_on.items()]
        return "\n".join(lines) + "\n"


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def json_encoder():
    """``obj -> bytes``: orjson where installed (the ``serve`` extra; ~0.1 ms less per ten hits with their text
    than the standard library), else ``json`` with the same compact separators."""
    try:
        import orjson
    except ImportError:
        return lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return lambda obj: orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def validation_message(errors) -> str:
    """A request model's first validation error as one line: ``field: what is wrong``."""
    first = errors[0] if errors else {}
    where = ".".join(_field(p) for p in first.get("loc", ()) if p != "body")
    return f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}"


def _field(part) -> str:
    """A field name or index as a message shows it: a key that is not a plain name (a client's filter key may hold
    anything, newlines included) quoted and escaped, and cut at 40 characters."""
    if isinstance(part, str) and not part.isidentifier():
        part = json.dumps(part[:40])
    return str(part)


async def send_json(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class LeanSearch:
    """ASGI: ``POST /search`` answered without FastAPI's routing, dependency solving and response classes (about
    0.4 ms a request on these cores, a third of the HTTP overhead); the body is validated by the same request
    model and answered by the same ``answer`` as the FastAPI route, which stays for the OpenAPI schema. Every
    other request goes to the FastAPI app."""

    def __init__(self, app, request_model, answer):
        self.app = app
        self.request_model = request_model
        self.answer = answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/search" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        from pydantic import ValidationError

        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away, or the body went over its bound and was answered with a 413
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            req = self.request_model.model_validate_json(b"".join(chunks))
        except ValidationError as e:
            return await send_json(send, 422, error_body(validation_message(e.errors())))
        await send_json(send, *await self.answer(req))


JSON_TYPES = frozenset((b"application/json",))
BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))


class Bounded:
    """ASGI middleware (plain, not Starlette's BaseHTTPMiddleware, which costs a task and a stream per request),
    in front of every request:

    * a ``Host`` that is not one of ``hosts`` gets 400 (DNS rebinding: a web page's own name resolved to
      127.0.0.1 would otherwise read this service);
    * a body sent with a method that has one must be JSON by its content type, else 415 (a cross-site form or
      ``text/plain`` fetch is a "simple" request that a browser sends without asking);
    * a body over the bound (declared or streamed) gets 413;
    * any unhandled error is a JSON 500 and the server keeps serving;
    * every response is counted by path and status; a request left unanswered because its client went away is
      counted as 499, one whose connection was closed by the read timeout as 408 (never as a 500).
    """

    PATHS = frozenset(("/search", "/healthz", "/metrics", "/"))

    def __init__(self, app, max_body_bytes: int, metrics: Metrics, hosts: frozenset[str]):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.hosts = hosts
        self._host_ok: dict[bytes, bool] = {}  # Host header values seen (a handful): allowed or not

    @staticmethod
    async def _json(send, status: int, message: str) -> None:
        await send_json(send, status, error_body(message))

    def _allowed(self, host: bytes | None) -> bool:
        ok = self._host_ok.get(host)
        if ok is None:
            ok = host is not None and host_name(host.decode("latin-1")) in self.hosts
            if len(self._host_ok) < 256:
                self._host_ok[host] = ok
        return ok

    def _refusal(self, scope, host: bytes | None, length: bytes | None, ctype: bytes | None) -> tuple[int, str] | None:
        if not self._allowed(host):
            shown = host.decode("latin-1")[:100] if host is not None else None
            return 400, (f"Host {shown!r} is not served here (loopback names only): start retr serve with "
                         f"--allow-host NAME to serve another name" if shown else "a Host header is required")
        if scope["method"] in BODY_METHODS and \
                (ctype is None or ctype.split(b";", 1)[0].strip().lower() not in JSON_TYPES):
            shown = ctype.decode("latin-1")[:100] if ctype is not None else "none"
            return 415, f"send the body as JSON with content-type: application/json (got {shown})"
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return 413, f"request body over {self.max_body_bytes} bytes"
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.PATHS else "other"
        host = length = ctype = None
        for k, v in scope["headers"]:
            if k == b"host":
                host = v
            elif k == b"content-length":
                length = v
            elif k == b"content-type":
                ctype = v
        refused = self._refusal(scope, host, length, ctype)
        if refused is not None:
            await self._json(send, *refused)
            self.metrics.request(path, refused[0])
            return
        status = [0]
        seen = [0]
        gone = [False]  # the client went away (or its request was cut off by the read timeout)
        over = [False]  # answered 413 while the app was still reading: whatever it sends after is dropped
        counted = length is None  # a declared length within the bound needs no counting: the parser reads no more

        async def bounded_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                gone[0] = True
                return message
            if counted:
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body_bytes and not over[0]:
                    over[0] = True
                    if not status[0]:
                        status[0] = 413
                        await self._json(send, 413, f"request body over {self.max_body_bytes} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def counted_send(message):
            if over[0]:
                return
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, bounded_receive, counted_send)
        except Exception:  # noqa: BLE001 - logged; the client gets a JSON error, the server keeps running
            if not over[0] and not gone[0]:
                logger.exception("request %s failed", scope["path"])
            if not status[0] and not gone[0]:
                status[0] = 500
                await self._json(send, 500, "internal error (logged by the server)")
        if not status[0] and gone[0]:
            status[0] = READ_TIMEOUT if scope.get(TIMED_OUT) else CLIENT_CLOSED
        self.metrics.request(path, status[0] or 500)


TIMED_OUT = "retr.read_timed_out"  # set in a request's scope when the read timeout closed its connection


@dataclass
class ConnectionCounts:
    """What the connection guard did (``/metrics``): connections refused over the cap, and requests (or
    connections that never sent one) closed by the read timeout."""
    refused: int = 0
    timed_out: int = 0


def _plain_response(status: str, message: str) -> bytes:
    body = error_body(message)
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


def guarded_protocol(timeout_s: float, max_connections: int, counts: ConnectionCounts):
    """uvicorn's httptools protocol with a read deadline and a connection cap, which uvicorn lacks: it waits for a
    request's headers and body without end (a client that sends headers and stalls holds its socket and task
    forever), and its ``limit_concurrency`` answers 503 only once headers arrive, so stalled clients still pile
    up. Here a request (and a connection before its first request) must arrive whole within ``timeout_s`` of its
    start, or is answered 408 and closed; a connection over ``max_connections`` is answered 503 and closed as it
    is accepted. Idle keep-alive connections are closed by uvicorn's own keep-alive timeout."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    timed_out = _plain_response("408 Request Timeout", f"the request did not arrive within {timeout_s:g} s")
    busy = _plain_response("503 Service Unavailable", f"over {max_connections} open connections: try again")

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                counts.refused += 1
                transport.write(busy)
                transport.close()
                return
            self._arm()

        def on_message_begin(self):
            super().on_message_begin()
            if self._deadline is None:
                self._arm()

        def on_message_complete(self):
            super().on_message_complete()
            self._disarm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._deadline = self.loop.call_later(timeout_s, self._timed_out)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self):
            self._deadline = None
            if self.transport.is_closing():
                return
            counts.timed_out += 1
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.scope[TIMED_OUT] = True  # the app, still reading the body, sees a disconnect: counted 408
            if cycle is None or cycle.response_complete or not cycle.response_started:
                self.transport.write(timed_out)
            self.transport.close()

    return GuardedHttpToolsProtocol


def startup_line(url: str, generations: "Generations") -> str:
    """What `retr serve` says once it listens: where, which folder, which generation, how many documents."""
    refused = "" if generations.refused is None else "; a newer generation on disk was refused"
    return (f"retr serve: listening on {url} : index {generations.folder}, generation {generations.number}, "
            f"{len(generations.current().index.ids)} documents{refused}")


def uvicorn_server(folder: str | Path, cfg: ServeConfig = ServeConfig(), host: str = "127.0.0.1", port: int = 8000,
                   announce: Callable[[str], None] | None = None):
    """A uvicorn server of ``create_app(folder, cfg)``, its app told how many connections the server holds, its
    connections guarded (``guarded_protocol``); ``announce(line)`` is called with ``startup_line`` once it
    listens."""
    import uvicorn

    server = None  # bound below: the app asks for the count only once requests arrive, after the server exists
    app = create_app(folder, cfg, open_connections=lambda: len(server.server_state.connections))
    counts = app.state.connections

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and announce is not None:
                announce(startup_line(self.url, app.state.generations))

        @property
        def url(self) -> str:
            address = self.servers[0].sockets[0].getsockname()
            name = f"[{address[0]}]" if ":" in address[0] else address[0]
            return f"http://{name}:{address[1]}/"

    # no access log: at the warning level it is never written, but uvicorn formats its fields on every response
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                   http=guarded_protocol(cfg.timeout_s, cfg.max_connections, counts),
                                   timeout_keep_alive=max(1, min(5, math.ceil(cfg.timeout_s)))))
    return server


def create_app(folder: str | Path, cfg: ServeConfig = ServeConfig(),
               open_connections: Callable[[], int] | None = None):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.convertors import PathConvertor, register_url_convertor
    from starlette.exceptions import HTTPException as StarletteHTTPException

    class AnyConvertor(PathConvertor):  # a path's rest, newlines too (an id may hold one: `/doc/a%0Ab`)
        regex = "[\\s\\S]*"

    register_url_convertor("any", AnyConvertor())

    generations = Generations(Path(folder), cfg)
    pool = ThreadPoolExecutor(cfg.search_threads or default_threads(), thread_name_prefix="retr-search")
    dispatch = Dispatch(pool, cfg.timeout_s, open_connections)
    metrics = Metrics()
    connections = ConnectionCounts()
    dumps = json_encoder()
    app = FastAPI(title="retr", description=f"Search the retr index {folder}", version="1")
    max_k = min(cfg.max_k, MAX_K)

    # the HTTP form of ``SearchRequest`` (retr.retrieval.options: every option declared once; this server's bounds)
    SearchBody = http_model(max_k, cfg.max_query_chars, cfg.max_batch,
                            {"fusion": cfg.pipeline.fusion, "fusion_depth": cfg.pipeline.fusion_depth})

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        return error(422, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)  # no such route, a method it does not take: the same shape
    async def http_error(_request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RetrError)
    async def retr_error(_request, exc: RetrError):
        return error(503 if isinstance(exc, DamagedPart) else 400, str(exc))

    def request_of(body: SearchBody) -> SearchRequest:
        reranks = body.rerank or body.mode.reranks
        options = {**body.options(), "rerank": cfg.rerank.model if reranks else None}
        if body.query is not None:
            return SearchRequest.one(body.query, **options)
        return SearchRequest.batch(body.queries, **options)

    async def answer(body: SearchBody) -> tuple[int, bytes]:
        """The status and JSON body for a validated search request (one code path for the lean route below and
        the FastAPI route that documents it)."""
        if (body.rerank or body.mode.reranks) and cfg.rerank is None:
            return 400, error_body("this server has no cross-encoder: start it with --rerank DIR")
        try:
            request = request_of(body)
            searcher = generations.current()
            results = await dispatch.run(searcher.run, request,
                                         brief=len(request.queries) == 1 and request.rerank is None)
        except TimeoutError:
            return 504, error_body(f"search took longer than {cfg.timeout_s} s")
        except DamagedPart as e:  # a part of the served generation changed on disk: /healthz says degraded
            return 503, error_body(str(e))
        except RetrError as e:
            return 400, error_body(str(e))
        # recorded once this task has written the response (the loop's next round), not while the client waits
        asyncio.get_running_loop().call_soon(metrics.observe_results, results)
        out = [r.to_dict() for r in results]
        # serialised here: FastAPI's generic encoder walks every field of every hit (~2 ms for ten documents)
        return 200, dumps(out[0] if body.query is not None else {"results": out})

    @app.post("/search", responses={400: {}, 413: {}, 415: {}, 422: {}, 504: {}})
    async def search(req: SearchBody):
        """One query (``query``) or a batch (``queries``); the JSON of `retr search --json` (a batch: under
        ``results``). Served by the lean route in front of FastAPI; declared here for the OpenAPI schema."""
        status, body = await answer(req)
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/search", responses={400: {}, 422: {}, 504: {}})
    async def search_get(request: Request):
        """One query as URL parameters: ``q`` (the query), ``k``, ``mode``, ``fusion``, ``fusion_depth``,
        ``rerank`` (true/false) and ``filter=FIELD=VALUE`` (repeatable); checked as the POST body is."""
        status, body = await answer(get_body(request.query_params.multi_items()))
        return Response(body, status_code=status, media_type="application/json")

    def get_body(items: list[tuple[str, str]]) -> SearchBody:
        from pydantic import ValidationError

        fields: dict = {}
        for name, value in items:
            key = "query" if name == "q" else name
            if key == "filter":
                field_name, eq, wanted = value.partition("=")
                if not eq or not field_name.strip():
                    raise RetrError(f"filter {value!r}: give FIELD=VALUE")
                fields.setdefault("filter", {})[field_name.strip()] = wanted
            elif key in fields or key in ("query", "queries") and name != "q":
                raise RetrError(f"give {name!r} once" if key in fields else "give the query as q=...")
            else:
                fields[key] = value
        try:
            return SearchBody.model_validate_strings(fields)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None

    @app.get("/doc/{doc_id:any}")
    async def document(doc_id: str, format: Literal["json", "html"] = "json"):
        doc = generations.current().document(doc_id)
        if doc is None:
            return error(404, f"no document {doc_id!r} in the index")
        if format == "html":
            return HTMLResponse(f"<!doctype html><meta charset=utf-8><title>{html.escape(doc.doc_id)}</title>"
                                f"<h1>{html.escape(doc.title or doc.doc_id)}</h1><p>{html.escape(doc.text)}</p>")
        return {"id": doc.doc_id, "title": doc.title, "text": doc.text}

    @app.get("/healthz")
    async def healthz():
        """``generation``: the served generation as its manifest says; ``opened``: generations this server has
        opened; ``refused``: a newer generation on disk that did not open (null when none), while the last good
        one is served (``status`` "degraded"); ``damaged``: a part of the served generation changed on disk (its
        size is not its manifest's: searches needing it answer 503), else null (``status`` "degraded")."""
        searcher = generations.current()
        refused, damaged = generations.refused, searcher.index.damage()
        return {"status": "ok" if refused is None and damaged is None else "degraded",
                "index": str(generations.folder), "generation": generations.number, "opened": generations.opened,
                "refused": None if refused is None else refused.to_dict(), "damaged": damaged,
                "documents": len(searcher.index.ids), "bm25": searcher.index.has_bm25,
                "rerank": cfg.rerank is not None, "time": time.time()}

    @app.get("/metrics")
    async def prometheus():
        generations.current()
        return PlainTextResponse(metrics.render(generations, {"loop": dispatch.inline, "threads": dispatch.pooled},
                                                connections),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    page_html = search_page(cfg)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(page_html)

    app.state.generations = generations
    app.state.metrics = metrics
    app.state.dispatch = dispatch
    app.state.connections = connections
    service = Bounded(LeanSearch(app, SearchBody, answer), max_body_bytes=cfg.max_body_bytes, metrics=metrics,
                      hosts=cfg.hosts)
    service.state = app.state
    return service


def search_page(cfg: ServeConfig) -> str:
    """The search page: its form's modes (the default first, selected) and bounds from the shared request's."""
    modes = [DEFAULT_MODE, *(m for m in FIRST_STAGES if m != DEFAULT_MODE)]
    options = "".join(f"<option{' selected' if m == DEFAULT_MODE else ''}>{m}</option>" for m in modes)
    return (SEARCH_PAGE.replace("{{MODES}}", options).replace("{{K}}", str(DEFAULT_K))
            .replace("{{MAX_K}}", str(min(cfg.max_k, 100))).replace("{{MAX_CHARS}}", str(cfg.max_query_chars))
            .replace("{{RERANK}}", "" if cfg.rerank else "disabled"))


SEARCH_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>retr search</title>
<style>
body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
form{display:flex;gap:.5rem;flex-wrap:wrap}input[type=search]{flex:1;min-width:16rem;padding:.5rem;font-size:1rem}
.hit{margin:1rem 0}.hit a{font-weight:600}.meta{color:#666;font-size:.85rem}mark{background:#ffe58a}
#timings{color:#555;font-size:.85rem;margin-top:1rem}#error{color:#b00020}
</style></head><body>
<h1>retr</h1>
<form id="f"><input id="q" type="search" name="q" placeholder="Search the index" autofocus required
maxlength="{{MAX_CHARS}}">
<select id="mode" name="mode">{{MODES}}</select>
<label><input id="rerank" type="checkbox" name="rerank" {{RERANK}}> rerank</label>
<input id="k" type="number" name="k" min="1" max="{{MAX_K}}" value="{{K}}" style="width:4rem">
<button>Search</button></form>
<div id="error"></div><div id="timings"></div><div id="results"></div>
<script>
// The query lives in the page's URL (?q=&mode=&k=, &rerank=1): a URL runs its search when loaded, a new search
// is a new history entry (the back button returns to the one before), and a result can be shared by its URL.
const $ = id => document.getElementById(id);
const esc = s => s.replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const defaults = {mode: $('mode').value, k: $('k').value};
let latest = 0;  // the last search started: an earlier one's late answer is dropped
function highlight(text, query) {
  const words = [...new Set(query.toLowerCase().match(/\\w\\w+/g) || [])];
  let out = esc(text);
  if (!words.length) return out;
  const re = new RegExp('\\\\b(' + words.map(w => w.replace(/[.*+?^${}()|[\\]\\\\]/g, '\\\\$&')).join('|') + ')', 'gi');
  return out.replace(re, '<mark>$1</mark>');
}
function clear() {
  latest++;
  for (const id of ['error', 'timings', 'results']) $(id).textContent = '';
}
function fromUrl() {  // the form as the URL says; false when it holds no query
  const p = new URLSearchParams(location.search);
  const mode = p.get('mode');
  $('mode').value = [...$('mode').options].some(o => o.value === mode) ? mode : defaults.mode;
  $('k').value = p.get('k') || defaults.k;
  $('rerank').checked = p.get('rerank') === '1' && !$('rerank').disabled;
  $('q').value = p.get('q') || '';
  return p.has('q');
}
function toUrl() {
  const p = new URLSearchParams({q: $('q').value, mode: $('mode').value, k: $('k').value});
  if ($('rerank').checked) p.set('rerank', '1');
  return '?' + p;
}
async function run() {
  const q = $('q').value, seq = ++latest;
  const body = {query: q, k: +$('k').value, mode: $('mode').value, rerank: $('rerank').checked};
  let r, data;
  try {
    r = await fetch('/search', {method: 'POST', headers: {'content-type': 'application/json'},
                                body: JSON.stringify(body)});
    data = await r.json();
  } catch (e) {
    r = {ok: false}; data = {error: 'no answer from the server (' + e + ')'};
  }
  if (seq !== latest) return;
  $('error').textContent = r.ok ? '' : data.error;
  if (!r.ok) { $('results').innerHTML = ''; $('timings').textContent = ''; return; }
  $('timings').textContent = Object.entries(data.latency_ms)
    .map(([s, ms]) => s + ' ' + ms.toFixed(2) + ' ms').join(' · ');
  $('results').innerHTML = data.results.map(h =>
    '<div class="hit"><a href="/doc/' + encodeURIComponent(h.id) + '?format=html">' +
    highlight(h.title || h.id, q) + '</a> <span class="meta">' + esc(h.id) + ' · ' + h.score.toFixed(4) +
    '</span><div>' + highlight(h.text.slice(0, 300), q) + (h.text.length > 300 ? '…' : '') + '</div></div>'
  ).join('') || '<p>No results.</p>';
}
$('f').addEventListener('submit', ev => {
  ev.preventDefault();
  const url = toUrl();
  if (url !== location.search) history.pushState(null, '', url);
  run();
});
window.addEventListener('popstate', () => { if (fromUrl()) run(); else clear(); });
if (fromUrl()) run();
</script></body></html>
"""
