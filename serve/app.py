"""The HTTP service behind `retr serve`: FastAPI over one index folder, on the same Searcher as `retr search`.

Endpoints: ``POST /search`` (one query or a batch; the JSON of `retr search --json`), ``GET /search?q=...``
(one query, its options as parameters, checked as the POST body is), ``GET /doc/{id}``, ``GET /healthz``,
``GET /metrics`` (Prometheus text), ``GET /`` (a search page whose URL holds the query: ``/?q=...&mode=...&k=...``),
OpenAPI at ``/docs``. Every input is bounded (query length, k, batch size, body size, time per request,
``retr.serve.guard``); a bad request gets a 4xx with a JSON error. Searches run in a worker thread (the event loop
never blocks on them; ``Dispatch`` says when a lone client's brief query runs on the loop's thread instead) and
share one loaded index and encoder. A new generation of the folder is opened and warmed off the event loop and
then served (``retr.serve.generations``); requests already running finish on the one they started with.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoint's request model (a class made per app, with
# this server's bounds) from the evaluated annotation
import asyncio
import html
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Literal

import orjson

from retr.retrieval.backends.runners import default_threads
from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import DamagedPart
from retr.retrieval.pipeline import FIRST_STAGES
from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE
from retr.serve.body import from_parameters, request_model, search_request, validation_message
from retr.serve.config import ServeConfig
from retr.serve.generations import Generations
from retr.serve.guard import Bounded, ConnectionCounts, error_body, guarded_protocol, send_json
from retr.serve.metrics import Metrics


class Dispatch:
    """Where a search runs. On the pool's threads, so that the event loop never waits on a search and concurrent
    searches run side by side; except brief work (one query, no reranking) while the server holds only the
    connection it came on and no other search is in flight: no other request can then be waiting for the loop, so
    the query runs on the loop's own thread and saves the two thread hand-offs (about 0.25 ms of the HTTP overhead
    at one client on 2 cores, measured with ``benchmarks/serve_load.py``: README, "Service"). A connection that
    opens meanwhile waits at most that one first-stage search (a hybrid SciFact query: ~10 ms).
    ``open_connections``: the ASGI server's count of open connections (uvicorn's server state, see
    ``uvicorn_server``); None where unknown, and then every search takes the pool. Batches and reranked queries,
    which may run long, always take the pool, where the request's deadline is kept. ``then()`` is called once
    ``fn`` has returned or will never run (a search that outlives its deadline still ends first)."""

    def __init__(self, pool: ThreadPoolExecutor, timeout_s: float, open_connections: Callable[[], int] | None = None):
        self.pool = pool
        self.timeout_s = timeout_s
        self.open_connections = open_connections
        self.in_flight = 0  # searches on the pool (read and written on the event loop's thread only)
        self.inline = self.pooled = 0  # searches run on the loop and on the pool (/metrics: retr_searches_total)

    async def run(self, fn: Callable, *args, brief: bool, then: Callable[[], None] = lambda: None):
        if brief and not self.in_flight and self.open_connections is not None and self.open_connections() <= 1:
            self.inline += 1
            try:
                return fn(*args)
            finally:
                then()
        try:
            future = self.pool.submit(fn, *args)
        except BaseException:
            then()
            raise
        future.add_done_callback(lambda _: then())
        self.in_flight += 1
        self.pooled += 1
        try:
            async with asyncio.timeout(self.timeout_s):  # no task of its own, unlike wait_for
                return await asyncio.wrap_future(future)
        finally:
            self.in_flight -= 1


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


def search_page(cfg: ServeConfig) -> str:
    """The search page (``page.html``): its form's modes (the default first, selected) and bounds from the shared
    request's."""
    modes = [DEFAULT_MODE, *(m for m in FIRST_STAGES if m != DEFAULT_MODE)]
    options = "".join(f"<option{' selected' if m == DEFAULT_MODE else ''}>{m}</option>" for m in modes)
    page = files("retr.serve").joinpath("page.html").read_text(encoding="utf-8")
    return (page.replace("{{MODES}}", options).replace("{{K}}", str(DEFAULT_K))
            .replace("{{MAX_K}}", str(min(cfg.max_k, 100))).replace("{{MAX_CHARS}}", str(cfg.max_query_chars))
            .replace("{{RERANK}}", "" if cfg.rerank else "disabled"))


def create_app(folder: str | Path, cfg: ServeConfig | None = None,
               open_connections: Callable[[], int] | None = None):
    cfg = cfg or ServeConfig()
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
    SearchBody = request_model(cfg)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        generations.close()
        pool.shutdown(wait=False)

    app = FastAPI(title="retr", description=f"Search the retr index {folder}", version="1", lifespan=lifespan)

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

    async def answer(body: SearchBody) -> tuple[int, bytes]:
        """The status and JSON body for a validated search request (one code path for the lean route and the
        FastAPI route that documents it). The search holds the generation it started on until it ends."""
        if (body.rerank or body.mode.reranks) and cfg.rerank is None:
            return 400, error_body("this server has no cross-encoder: start it with --rerank DIR")
        try:
            request = search_request(body, cfg)
            served = generations.acquire()
            results = await dispatch.run(served.searcher.run, request, then=lambda: generations.release(served),
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
        # serialised here, by orjson: FastAPI's generic encoder walks every field of every hit (~2 ms for ten
        # documents); orjson takes ~0.1 ms less per ten hits with their text than the standard library
        return 200, orjson.dumps(out[0] if body.query is not None else {"results": out},
                                 option=orjson.OPT_SERIALIZE_NUMPY)

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
        status, body = await answer(from_parameters(SearchBody, request.query_params.multi_items()))
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/doc/{doc_id:any}")
    async def document(doc_id: str, format: Literal["json", "html"] = "json"):
        with generations.lease() as searcher:
            doc = searcher.document(doc_id)
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
        with generations.lease() as searcher:
            refused, damaged = generations.refused, searcher.index.damage()
            return {"status": "ok" if refused is None and damaged is None else "degraded",
                    "index": str(generations.folder), "generation": generations.number,
                    "opened": generations.opened, "refused": refused,
                    "damaged": damaged, "documents": len(searcher.index.ids), "bm25": searcher.index.has_bm25,
                    "rerank": cfg.rerank is not None, "time": time.time()}

    @app.get("/metrics")
    async def prometheus():
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


def startup_line(url: str, generations: Generations) -> str:
    """What `retr serve` says once it listens: where, which folder, which generation, how many documents."""
    refused = "" if generations.refused is None else "; a newer generation on disk was refused"
    with generations.lease() as searcher:
        documents = len(searcher.index.ids)
    return (f"retr serve: listening on {url} : index {generations.folder}, generation {generations.number}, "
            f"{documents} documents{refused}")


def uvicorn_server(folder: str | Path, cfg: ServeConfig | None = None, host: str = "127.0.0.1", port: int = 8000,
                   announce: Callable[[str], None] | None = None):
    """A uvicorn server of ``create_app(folder, cfg)``, its app told how many connections the server holds, its
    connections guarded (``guarded_protocol``); ``announce(line)`` is called with ``startup_line`` once it
    listens."""
    import uvicorn

    cfg = cfg or ServeConfig()
    server = None  # bound below: the app asks for the count only once requests arrive, after the server exists
    app = create_app(folder, cfg, open_connections=lambda: len(server.server_state.connections))

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
                                   http=guarded_protocol(cfg.timeout_s, cfg.max_connections, app.state.connections),
                                   timeout_keep_alive=max(1, min(5, math.ceil(cfg.timeout_s)))))
    return server
