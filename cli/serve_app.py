"""The HTTP service behind `retr serve`: FastAPI over one index folder, on the same Searcher as `retr search`.

Endpoints: ``POST /search`` (one query or a batch; the JSON of `retr search --json`), ``GET /doc/{id}``,
``GET /healthz``, ``GET /metrics`` (Prometheus text), ``GET /`` (a search page), OpenAPI at ``/docs``.
Every input is bounded (query length, k, batch size, body size, time per request); a bad request gets a 4xx
with a JSON error. Searches run in a worker thread (the event loop never blocks on them; ``Dispatch`` says when
a lone client's brief query runs on the loop's thread instead) and share one loaded index and encoder. When the
folder is rebuilt or replaced (atomic rename), the next request opens the new generation; requests already
running finish on the one they started with.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoint's request model (a class made per app, with
# this server's bounds) from the evaluated annotation
import asyncio
import bisect
import html
import json
import logging
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
from retr.retrieval.backends.runners import default_threads
from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import PipelineConfig
from retr.retrieval.rerank import RerankConfig

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class ServeConfig:
    max_query_chars: int = 2000
    max_k: int = 1000
    max_batch: int = 64
    max_body_bytes: int = 1 << 20
    # searches in flight at once, each on a thread of its own (default: the cores, at most 4): with one-thread
    # query graphs, one search per core
    search_threads: int = 0
    timeout_s: float = 30.0
    encoder: EncoderConfig = EncoderConfig()
    pipeline: PipelineConfig = PipelineConfig()
    rerank: RerankConfig | None = None


class Generations:
    """The Searcher of the folder's current generation: reopened when its manifest is replaced."""

    def __init__(self, folder: Path, cfg: ServeConfig):
        self.folder = Path(folder)
        self.cfg = cfg
        self._lock = threading.Lock()
        self.number = 0
        self._stamp = None
        self._searcher: Searcher | None = None
        self.current()

    def _manifest_stamp(self):
        st = os.stat(self.folder / "manifest.json")
        return st.st_ino, st.st_mtime_ns, st.st_size

    def current(self) -> Searcher:
        try:
            stamp = self._manifest_stamp()
        except OSError:
            stamp = None  # mid-swap or removed: keep serving the generation we have
        with self._lock:
            if self._searcher is None or (stamp is not None and stamp != self._stamp):
                searcher = (Searcher(self.folder, self.cfg.encoder, self.cfg.pipeline, self.cfg.rerank,
                                     checker=check_index_reranker)
                            if self._searcher is None else self._searcher.reopened())
                if self.cfg.rerank is not None:  # loaded (and checked on this corpus) before any request waits on it
                    searcher.reranker(self.cfg.rerank.model)
                if self._searcher is not None:
                    logger.info("%s changed: generation %d opened", self.folder, self.number + 1)
                self._searcher, self._stamp = searcher, stamp
                self.number += 1
            return self._searcher


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

    def render(self, generation: int, searches_on: dict[str, int] | None = None) -> str:
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
            lines += ["# HELP retr_index_generation Generation of the index folder being served.",
                      "# TYPE retr_index_generation gauge", f"retr_index_generation {generation}"]
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
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}"


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


class Bounded:
    """ASGI middleware (plain, not Starlette's BaseHTTPMiddleware, which costs a task and a stream per request):
    refuses a body over the bound (declared or streamed) with 413, answers any unhandled error with a JSON 500 and
    keeps serving, and counts every response by path and status."""

    PATHS = frozenset(("/search", "/healthz", "/metrics", "/"))

    def __init__(self, app, max_body_bytes: int, metrics: Metrics):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    @staticmethod
    async def _json(send, status: int, message: str) -> None:
        await send_json(send, status, error_body(message))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.PATHS else "other"
        status = [0]
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._json(send, 413, f"request body over {self.max_body_bytes} bytes")
            self.metrics.request(path, 413)
            return
        seen = [0]
        refused = [False]  # answered 413 while the app was still reading: whatever it sends after is dropped

        async def bounded_receive():
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > self.max_body_bytes and not refused[0]:
                refused[0] = True
                if not status[0]:
                    status[0] = 413
                    await self._json(send, 413, f"request body over {self.max_body_bytes} bytes")
                return {"type": "http.disconnect"}
            return message

        async def counted_send(message):
            if refused[0]:
                return
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            # a declared length within the bound needs no counting: the HTTP parser reads no more than it declares
            await self.app(scope, receive if length is not None else bounded_receive, counted_send)
        except Exception:  # noqa: BLE001 - logged; the client gets a JSON error, the server keeps running
            if not refused[0]:
                logger.exception("request %s failed", scope["path"])
            if not status[0]:
                status[0] = 500
                await self._json(send, 500, "internal error (logged by the server)")
        self.metrics.request(path, status[0] or 500)


def uvicorn_server(folder: str | Path, cfg: ServeConfig = ServeConfig(), host: str = "127.0.0.1", port: int = 8000):
    """A uvicorn server of ``create_app(folder, cfg)``, its app told how many connections the server holds."""
    import uvicorn

    server = None  # bound below: the app asks for the count only once requests arrive, after the server exists
    app = create_app(folder, cfg, open_connections=lambda: len(server.server_state.connections))
    # no access log: at the warning level it is never written, but uvicorn formats its fields on every response
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    return server


def create_app(folder: str | Path, cfg: ServeConfig = ServeConfig(),
               open_connections: Callable[[], int] | None = None):
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, model_validator

    generations = Generations(Path(folder), cfg)
    pool = ThreadPoolExecutor(cfg.search_threads or default_threads(), thread_name_prefix="retr-search")
    dispatch = Dispatch(pool, cfg.timeout_s, open_connections)
    metrics = Metrics()
    dumps = json_encoder()
    app = FastAPI(title="retr", description=f"Search the retr index {folder}", version="1")

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str | None = Field(None, min_length=1, max_length=cfg.max_query_chars)
        queries: list[str] | None = Field(None, min_length=1, max_length=cfg.max_batch)
        k: int = Field(10, ge=1, le=cfg.max_k)
        mode: Literal["bm25", "dense", "hybrid"] = "hybrid"
        rerank: bool = False
        filter: dict[str, str | int | float | bool] | None = Field(None, max_length=16)

        @model_validator(mode="after")
        def one_of(self):
            if (self.query is None) == (self.queries is None):
                raise ValueError("give either 'query' or 'queries'")
            for q in self.queries or ():
                if len(q) > cfg.max_query_chars:
                    raise ValueError(f"a query is longer than {cfg.max_query_chars} characters")
            return self

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        return error(422, validation_message(exc.errors()))

    @app.exception_handler(RetrError)
    async def retr_error(_request, exc: RetrError):
        return error(400, str(exc))

    async def answer(req: SearchRequest) -> tuple[int, bytes]:
        """The status and JSON body for a validated search request (one code path for the lean route below and
        the FastAPI route that documents it)."""
        if req.rerank and cfg.rerank is None:
            return 400, error_body("this server has no cross-encoder: start it with --reranker DIR")
        queries = [req.query] if req.query is not None else req.queries
        rerank = cfg.rerank.model if req.rerank else None
        try:
            searcher = generations.current()
            results = await dispatch.run(searcher.search_many, queries, req.k, req.mode, rerank, req.filter,
                                         brief=len(queries) == 1 and rerank is None)
        except TimeoutError:
            return 504, error_body(f"search took longer than {cfg.timeout_s} s")
        except RetrError as e:
            return 400, error_body(str(e))
        # recorded once this task has written the response (the loop's next round), not while the client waits
        asyncio.get_running_loop().call_soon(metrics.observe_results, results)
        body = [r.to_dict() for r in results]
        # serialised here: FastAPI's generic encoder walks every field of every hit (~2 ms for ten documents)
        return 200, dumps(body[0] if req.query is not None else {"results": body})

    @app.post("/search", responses={400: {}, 422: {}, 504: {}})
    async def search(req: SearchRequest):
        """One query (``query``) or a batch (``queries``); the JSON of `retr search --json` (a batch: under
        ``results``). Served by the lean route in front of FastAPI; declared here for the OpenAPI schema."""
        status, body = await answer(req)
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/doc/{doc_id:path}")
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
        searcher = generations.current()
        return {"status": "ok", "index": str(generations.folder), "generation": generations.number,
                "documents": len(searcher.index.ids), "bm25": searcher.index.has_bm25,
                "rerank": cfg.rerank is not None, "time": time.time()}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(generations.number, {"loop": dispatch.inline,
                                                                     "threads": dispatch.pooled}),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(SEARCH_PAGE.replace("{{RERANK}}", "" if cfg.rerank else "disabled"))

    app.state.generations = generations
    app.state.metrics = metrics
    app.state.dispatch = dispatch
    service = Bounded(LeanSearch(app, SearchRequest, answer), max_body_bytes=cfg.max_body_bytes, metrics=metrics)
    service.state = app.state
    return service


SEARCH_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>retr search</title>
<style>
body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
form{display:flex;gap:.5rem;flex-wrap:wrap}input[type=search]{flex:1;min-width:16rem;padding:.5rem;font-size:1rem}
.hit{margin:1rem 0}.hit a{font-weight:600}.meta{color:#666;font-size:.85rem}mark{background:#ffe58a}
#timings{color:#555;font-size:.85rem;margin-top:1rem}#error{color:#b00020}
</style></head><body>
<h1>retr</h1>
<form id="f"><input id="q" type="search" name="q" placeholder="Search the index" autofocus required maxlength="2000">
<select id="mode"><option>hybrid</option><option>dense</option><option>bm25</option></select>
<label><input id="rerank" type="checkbox" {{RERANK}}> rerank</label>
<input id="k" type="number" min="1" max="100" value="10" style="width:4rem"><button>Search</button></form>
<div id="error"></div><div id="timings"></div><div id="results"></div>
<script>
const esc = s => s.replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
function highlight(text, query) {
  const words = [...new Set(query.toLowerCase().match(/\\w\\w+/g) || [])];
  let out = esc(text);
  if (!words.length) return out;
  const re = new RegExp('\\\\b(' + words.map(w => w.replace(/[.*+?^${}()|[\\]\\\\]/g, '\\\\$&')).join('|') + ')', 'gi');
  return out.replace(re, '<mark>$1</mark>');
}
document.getElementById('f').addEventListener('submit', async ev => {
  ev.preventDefault();
  const q = document.getElementById('q').value;
  const body = {query: q, k: +document.getElementById('k').value, mode: document.getElementById('mode').value,
                rerank: document.getElementById('rerank').checked};
  const r = await fetch('/search', {method: 'POST', headers: {'content-type': 'application/json'},
                                    body: JSON.stringify(body)});
  const data = await r.json();
  document.getElementById('error').textContent = r.ok ? '' : data.error;
  if (!r.ok) { document.getElementById('results').innerHTML = ''; return; }
  document.getElementById('timings').textContent = Object.entries(data.latency_ms)
    .map(([s, ms]) => s + ' ' + ms.toFixed(2) + ' ms').join(' · ');
  document.getElementById('results').innerHTML = data.results.map(h =>
    '<div class="hit"><a href="/doc/' + encodeURIComponent(h.id) + '?format=html">' +
    highlight(h.title || h.id, q) + '</a> <span class="meta">' + esc(h.id) + ' · ' + h.score.toFixed(4) +
    '</span><div>' + highlight(h.text.slice(0, 300), q) + (h.text.length > 300 ? '…' : '') + '</div></div>'
  ).join('') || '<p>No results.</p>';
});
</script></body></html>
"""
