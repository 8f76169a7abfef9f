"""What stands in front of every request: the ``Host`` served, a JSON body by its content type, the body's
bound, a read deadline and a cap on open connections (``Bounded``, an ASGI middleware, and ``guarded_protocol``,
uvicorn's httptools protocol with the two limits it lacks). Safe on a laptop: only the loopback names (and
``--allow-host`` names) are served as ``Host`` (no DNS rebinding), a body is JSON by content type (no cross-site
simple POST), a request must arrive whole within the timeout (a stalled client is answered 408 and closed) and
the open connections are capped (the file descriptors held are bounded).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from retr.serve.config import host_name
from retr.serve.metrics import Metrics

logger = logging.getLogger(__name__)

# statuses of requests that got no answer from the app: the client left mid-request (nginx's 499), or its request
# did not arrive whole within the timeout (408, written by the connection's guard)
CLIENT_CLOSED, READ_TIMEOUT = 499, 408
TIMED_OUT = "retr.read_timed_out"  # set in a request's scope when the read timeout closed its connection


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def send_json(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, status: int, message: str) -> None:
    await send_json(send, status, error_body(message))


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
            await send_error(send, *refused)
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
                        await send_error(send, 413, f"request body over {self.max_body_bytes} bytes")
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
                await send_error(send, 500, "internal error (logged by the server)")
        if not status[0] and gone[0]:
            status[0] = READ_TIMEOUT if scope.get(TIMED_OUT) else CLIENT_CLOSED
        self.metrics.request(path, status[0] or 500)



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

