"""`retr serve` safe on a laptop (issue 41, cases 10-16): only loopback Host names, JSON bodies only, requests that
must arrive within the timeout, a cap on connections (file descriptors and memory bounded under 500 stalled
clients), a disconnect is not a 500, port and timeout checked, a startup line, a warning on a non-loopback bind,
and the last good generation kept while a damaged one is refused. HTTP inputs are also tried by Hypothesis
against the in-process app: any JSON body gets a 2xx or a 4xx, never a 5xx."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import hypothesis  # the test extra's (pyproject.toml): missing is a broken install, not a reason to skip
import hypothesis.strategies
import pytest

from retr.cli.main import main

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from .serving import Server, on_disk_generation  # noqa: E402 - after the skips: it imports uvicorn

TIMEOUT_S = 2  # the served process's --timeout: short, so that stalled clients are let go quickly


def build_index(corpus: Path, model: Path, out: Path) -> Path:
    assert main(["index", "--corpus", str(corpus), "--out", str(out), "--model", str(model), "--backend", "onnx",
                 "--bm25"]) == 0
    return out


@pytest.fixture(scope="module")
def index(tiny_dataset, tiny_bi_encoder, tmp_path_factory) -> Path:
    return build_index(tiny_dataset, tiny_bi_encoder, tmp_path_factory.mktemp("safety") / "idx")


@pytest.fixture(scope="module")
def served(index):
    """One in-thread server for the tests that only read (Host, content type)."""
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    server = Server(index, ServeConfig(encoder=EncoderConfig(backend="onnx"), max_batch=4))
    yield server
    server.stop()


class Process:
    """`retr serve` in a process of its own (``--port 0``), found by its startup line on stderr."""

    def __init__(self, folder: Path, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retr.cli.main", "serve", str(folder), "--port", "0", "--backend", "onnx", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        started = threading.Event()

        def read():  # drained to the end: a full pipe would stall the server
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("retr serve: listening on"):
                    started.set()
            started.set()

        threading.Thread(target=read, daemon=True).start()
        started.wait(180)
        line = next((x for x in self.lines if x.startswith("retr serve: listening on")), None)
        if line is None:
            self.stop()
            raise AssertionError("no startup line:\n" + "\n".join(self.lines[-20:]))
        self.startup = line
        self.url = re.search(r"(http://\S+?)/? ", line).group(1)
        parts = urlsplit(self.url)
        self.addr = (parts.hostname, parts.port)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return next(int(x.split()[1]) for x in fh if x.startswith("VmRSS")) / 1024

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection(*self.addr, timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def post(self, body: dict) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(*self.addr, timeout=30)
        try:
            conn.request("POST", "/search", json.dumps(body), {"content-type": "application/json"})
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def process(index):
    served = Process(index, "--timeout", str(TIMEOUT_S))
    yield served
    served.stop()


def stalled(addr, declared: int = 100, sent: bytes = b"{") -> socket.socket:
    """A client that sends a request's headers and the start of its body, then nothing."""
    sock = socket.create_connection(addr, timeout=30)
    sock.sendall(f"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {declared}\r\n\r\n".encode() + sent)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """What the server wrote before it closed the connection (the status line and the rest)."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def raw_request(url: str, method: str, path: str, headers: dict[str, str], body: bytes = b"",
                http10: bool = False) -> tuple[int, dict]:
    """One request with exactly ``headers`` (no Host added unless given)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if body:
            head += f"Content-Length: {len(body)}\r\n"
        sock.sendall(f"{method} {path} HTTP/1.{0 if http10 else 1}\r\n{head}Connection: close\r\n\r\n".encode()
                     + body)
        r = http.client.HTTPResponse(sock)
        r.begin()
        data = r.read()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {}


# -- case 10: Host and content type ----------------------------------------------------------------------------

@pytest.mark.parametrize("host,status", [
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("LOCALHOST.:{port}", 200), ("[::1]:{port}", 200),
    ("127.0.0.1", 200),
    ("evil.example", 400), ("evil.example:{port}", 400), ("127.0.0.1.evil.example:{port}", 400),
    ("localhost.evil.example", 400), ("", 400),
])
def test_only_loopback_host_names_are_answered(served, host, status):
    """DNS rebinding: a page on evil.example whose name is made to resolve to 127.0.0.1 sends Host: evil.example."""
    port = urlsplit(served.url).port
    got, body = raw_request(served.url, "GET", "/healthz", {"Host": host.format(port=port)})
    assert got == status, (host, got, body)
    if status == 400:
        assert "Host" in body["error"] and "--allow-host" in body["error"] or "required" in body["error"]
        got, body = raw_request(served.url, "POST", "/search", {"Host": host.format(port=port),
                                                                "Content-Type": "application/json"},
                                json.dumps({"query": "solar"}).encode())
        assert got == 400, "a search from a rebound name must be refused too"


def test_a_request_without_host_is_refused(served):
    assert raw_request(served.url, "GET", "/healthz", {}, http10=True)[0] == 400


def test_allow_host_widens_the_names(index):
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    server = Server(index, ServeConfig(encoder=EncoderConfig(backend="onnx"), allowed_hosts=("Search.LAN",)))
    try:
        assert raw_request(server.url, "GET", "/healthz", {"Host": "search.lan:8080"})[0] == 200
        assert raw_request(server.url, "GET", "/healthz", {"Host": "localhost"})[0] == 200
        assert raw_request(server.url, "GET", "/healthz", {"Host": "other.lan"})[0] == 400
    finally:
        server.stop()


@pytest.mark.parametrize("ctype,status", [
    ("text/plain", 415), ("text/plain;charset=UTF-8", 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), (None, 415),
    ("application/json", 200), ("Application/JSON; charset=utf-8", 200),
])
def test_bodies_are_json_by_content_type(served, ctype, status):
    """A cross-site page may send a "simple" POST (text/plain, a form) without a preflight: refused unread."""
    headers = {"Host": "127.0.0.1"} | ({"Content-Type": ctype} if ctype else {})
    got, body = raw_request(served.url, "POST", "/search", headers, json.dumps({"query": "solar"}).encode())
    assert got == status, (ctype, got, body)
    if status == 415:
        assert "application/json" in body["error"]


# -- cases 11 and 15: stalled and slow clients, disconnects ----------------------------------------------------

def test_startup_line_names_url_index_generation_and_documents(process, index):
    """Case 12: the server says where it listens (port 0: the port it got), what it serves."""
    m = re.fullmatch(r"retr serve: listening on http://127\.0\.0\.1:(\d+)/ : index (.+), generation (\d+), "
                     r"(\d+) documents", process.startup)
    assert m, process.startup
    assert int(m[1]) > 0 and Path(m[2]) == index and int(m[3]) == on_disk_generation(index) and int(m[4]) == 16
    status, health = process.get("/healthz")
    assert status == 200 and json.loads(health)["documents"] == 16


def test_a_slow_client_is_answered_408_and_others_are_served_meanwhile(process):
    body = json.dumps({"query": "solar panels", "k": 2, "mode": "bm25"}).encode()
    # a body trickled a byte at a time would take ~10 s: cut off at the timeout with a 408
    trickle = socket.create_connection(process.addr, timeout=30)
    trickle.sendall(f"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode())
    answered = []

    def drip():
        try:
            for b in body:
                trickle.sendall(bytes([b]))
                time.sleep(10 / len(body))
        except OSError:
            pass  # closed by the server, as it should be

    dripping = threading.Thread(target=drip)
    dripping.start()
    # meanwhile another client is answered: the server does not wait on the slow one
    status, found = process.post({"query": "wolves tundra", "k": 2, "mode": "bm25"})
    answered.append(status)
    # a slow client whose body arrives within the timeout is served
    slow = socket.create_connection(process.addr, timeout=30)
    slow.sendall(f"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    for piece in (body[:10], body[10:20], body[20:]):
        time.sleep(0.3)
        slow.sendall(piece)
    ok = answer_of(slow)
    slow.close()
    cut = answer_of(trickle)
    dripping.join()
    trickle.close()
    assert answered == [200] and [h["id"] for h in found["results"]][:1] == ["d9"]
    assert ok.startswith(b"HTTP/1.1 200"), ok[:200]
    assert cut.startswith(b"HTTP/1.1 408") and b"did not arrive" in cut, cut[:200]


def count(metrics: str, status: int) -> int:
    found = re.search(rf'retr_requests_total{{path="/search",status="{status}"}} (\d+)', metrics)
    return int(found[1]) if found else 0


def test_a_client_leaving_mid_body_is_not_a_500(process):
    before = count(process.get("/metrics")[1], 499)
    for _ in range(3):
        sock = stalled(process.addr, declared=60, sent=b'{"query": "sol')
        time.sleep(0.1)
        sock.close()
    deadline = time.time() + 10
    while count(text := process.get("/metrics")[1], 499) < before + 3 and time.time() < deadline:
        time.sleep(0.1)
    assert count(text, 500) == 0, text
    assert count(text, 499) == before + 3, "a client that left mid-body is counted as 499 (client closed)"


def test_500_stalled_clients_hold_bounded_descriptors_and_memory_freed_by_the_timeout(process):
    """Case 11: clients that send headers and stall their body. Each accepted one is let go (408) at the timeout;
    over --max-connections (128) a connection is answered 503 and closed as it comes; so the server's open files
    stay bounded (before: +500, held with no end) and return to where they were."""
    from retr.cli.serve import ServeDefaults

    assert process.get("/healthz")[0] == 200
    fds, rss = process.fds(), process.rss_mb()
    clients = [stalled(process.addr) for _ in range(500)]
    time.sleep(0.5)
    fds_held, rss_held = process.fds(), process.rss_mb()
    assert fds_held <= fds + ServeDefaults.max_connections + 16, (fds, fds_held)
    assert rss_held - rss < 64, (rss, rss_held)
    answers = [answer_of(c) for c in clients]  # every one is answered and closed by the server
    for c in clients:
        c.close()
    statuses = {a[:12] for a in answers}
    assert statuses <= {b"HTTP/1.1 408", b"HTTP/1.1 503"} and b"HTTP/1.1 503" in statuses, statuses
    deadline = time.time() + TIMEOUT_S + 10
    while process.fds() > fds + 2 and time.time() < deadline:
        time.sleep(0.1)
    assert process.fds() <= fds + 2, (fds, process.fds())
    assert process.rss_mb() - rss < 64
    status, text = process.get("/metrics")
    assert status == 200 and int(re.search(r"retr_connections_refused_total (\d+)", text)[1]) > 0
    assert int(re.search(r"retr_read_timeouts_total (\d+)", text)[1]) > 0
    assert process.post({"query": "solar", "k": 1})[0] == 200  # still serving


# -- cases 12, 15, 16: options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--port", "99999"], "port"), (["--port", "-1"], "port"), (["--port", "http"], "port"),
    (["--timeout", "0"], "timeout"), (["--timeout", "-5"], "timeout"), (["--timeout", "nan"], "timeout"),
    (["--timeout", "inf"], "timeout"), (["--max-connections", "0"], "max-connections"),
])
def test_port_and_timeout_are_checked_before_anything_runs(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["serve", str(tmp_path / "no-index"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_port_zero_and_the_defaults_are_accepted():
    from retr.cli.main import build_parser
    from retr.cli.serve import ServeDefaults
    from retr.serve.config import ServeConfig

    args = build_parser().parse_args(["serve", "idx", "--port", "0"])
    assert args.port == 0 and args.timeout == ServeConfig.timeout_s == ServeDefaults.timeout_s
    assert args.max_connections == ServeConfig.max_connections == ServeDefaults.max_connections
    assert args.max_batch == ServeConfig.max_batch == ServeDefaults.max_batch


@pytest.mark.parametrize("field,value", [("timeout_s", 0), ("timeout_s", -5.0), ("timeout_s", float("nan")),
                                         ("max_connections", 0), ("max_batch", True)])
def test_serve_config_refuses_bad_bounds(field, value):
    from retr.retrieval.errors import RetrError
    from retr.serve.config import ServeConfig

    with pytest.raises(RetrError, match=field.removesuffix("_s")):
        ServeConfig(**{field: value})


def test_a_non_loopback_bind_is_warned_about(index, capsys):
    """Case 16. 192.0.2.1 (TEST-NET-1) is no address of this machine: the warning is printed, then the bind fails
    with a one-line error (nothing listens, nothing reaches the network)."""
    assert main(["serve", str(index), "--host", "192.0.2.1", "--port", "0", "--backend", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "warning: listening on 192.0.2.1, not loopback" in err and "could not listen on 192.0.2.1" in err


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True),
                                           ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                           ("192.168.1.5", False), ("my-laptop.lan", False)])
def test_loopback_addresses(host, loopback):
    from retr.serve.config import is_loopback

    assert is_loopback(host) is loopback


# -- cases 13 and 14: a damaged generation ---------------------------------------------------------------------

def replace_manifest(folder: Path, data: bytes) -> None:
    """A new manifest published as writers publish one: written beside, renamed over (a new inode)."""
    tmp = folder / "manifest.json.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / "manifest.json")


@pytest.mark.parametrize("damage", ["unreadable", "wrong counts"])
def test_a_damaged_generation_is_refused_and_the_last_good_one_served(tiny_dataset, tiny_bi_encoder, tmp_path,
                                                                      damage):
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    idx = build_index(tiny_dataset, tiny_bi_encoder, tmp_path / "idx")
    good = (idx / "manifest.json").read_bytes()
    generation = on_disk_generation(idx)
    server = Server(idx, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        status, before = server.request("/search", {"query": "wolves tundra", "k": 3})
        assert status == 200
        if damage == "unreadable":
            replace_manifest(idx, b'{"format": "retr-index", "num_do')
        else:
            manifest = json.loads(good)
            manifest["num_docs"] += 100
            replace_manifest(idx, json.dumps(manifest).encode())
        server.wait_for(lambda health: health["refused"] is not None)  # the watcher has tried it
        for _ in range(3):  # every request still answered, from the last good generation
            status, after = server.request("/search", {"query": "wolves tundra", "k": 3})
            assert status == 200 and after["results"] == before["results"], after
        status, health = server.request("/healthz")
        assert status == 200 and health["status"] == "degraded" and health["generation"] == generation
        assert health["opened"] == 1 and health["documents"] == 16
        refused = health["refused"]
        assert refused["error"] and refused["generation"] == (None if damage == "unreadable" else generation)
        assert "manifest" in refused["error"] or "100" in refused["error"] or "116" in refused["error"]
        text = server.request("/metrics")[1]
        assert "retr_index_refused 1\n" in text and f"retr_index_generation {generation}\n" in text
        replace_manifest(idx, good)  # repaired: opened, and healthy again
        server.wait_for(lambda health: health["refused"] is None)
        status, health = server.request("/healthz")
        assert (health["status"], health["refused"], health["opened"]) == ("ok", None, 2)
    finally:
        server.stop()


def test_healthz_reports_the_manifests_generation_not_the_servers_count(tiny_dataset, tiny_bi_encoder, tmp_path):
    """Case 14: after `retr add`, the served generation is the manifest's (+1), whatever the server opened."""
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    index = build_index(tiny_dataset, tiny_bi_encoder, tmp_path / "idx")
    served = Server(index, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        generations_after_changes(served, index, tmp_path)
    finally:
        served.stop()


def generations_after_changes(served, index, tmp_path):
    before = served.request("/healthz")[1]
    assert before["generation"] == on_disk_generation(index)
    corpus = tmp_path / "one.jsonl"
    corpus.write_text(json.dumps({"_id": "extra1", "title": "Comets", "text": "comet tails of dust"}) + "\n")
    assert main(["add", str(index), "--corpus", str(corpus)]) == 0
    served.wait_for(lambda health: health["opened"] == before["opened"] + 1)
    after = served.request("/healthz")[1]
    assert after["generation"] == before["generation"] + 1 == on_disk_generation(index)
    assert after["opened"] == before["opened"] + 1 and after["documents"] == 17
    (tmp_path / "gone.txt").write_text("extra1\n")
    assert main(["delete", str(index), "--ids", str(tmp_path / "gone.txt")]) == 0
    served.wait_for(lambda health: health["opened"] == before["opened"] + 2)
    assert served.request("/healthz")[1]["documents"] == 16


# -- property-based: any JSON body -> 2xx or 4xx ---------------------------------------------------------------

st = hypothesis.strategies

SCALARS = st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.text(max_size=30)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=4), max_leaves=12)
TEXT = st.text(max_size=60) | st.sampled_from(["solar panels", "wolves", " ", "\u200b", "\x00", "a" * 2001])
BODIES = st.fixed_dictionaries({}, optional={
    "query": TEXT | JSON,
    "queries": st.lists(TEXT, max_size=6) | JSON,
    "k": st.integers(-3, 20000) | JSON,
    "mode": st.sampled_from(["bm25", "dense", "hybrid", "colbert", ""]) | JSON,
    "fusion": st.sampled_from(["minmax", "zscore", "rrf", "max"]) | JSON,
    "fusion_depth": st.integers(-3, 20000) | JSON,
    "rerank": st.booleans() | JSON,
    "filter": st.dictionaries(st.text(max_size=8), SCALARS, max_size=3) | JSON,
    "extra": JSON,
})


class InProcess:
    """The service's ASGI app called directly (no sockets): one request, its status and JSON body."""

    def __init__(self, app):
        self.app = app
        self.loop = asyncio.new_event_loop()

    def call(self, method: str, path: str, body: bytes = b"", query: bytes = b"") -> tuple[int, bytes]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": quote(path).encode(), "query_string": query,
                 "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        sent = {"status": 0, "body": b""}
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            else:
                sent["body"] += message.get("body", b"")

        self.loop.run_until_complete(self.app(scope, receive, send))
        return sent["status"], sent["body"]


@pytest.fixture(scope="module")
def in_process(index):
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.app import create_app
    from retr.serve.config import ServeConfig

    client = InProcess(create_app(index, ServeConfig(encoder=EncoderConfig(backend="onnx"), max_batch=4)))
    yield client
    client.loop.close()


def check_answer(status: int, body: bytes) -> None:
    assert 200 <= status < 500, (status, body[:300])
    data = json.loads(body)
    if status >= 400:
        assert isinstance(data["error"], str) and data["error"] and "\n" not in data["error"]


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(body=BODIES)
def test_any_search_body_gets_a_2xx_or_a_4xx(in_process, body):
    try:
        raw = json.dumps(body).encode()  # NaN / Infinity included: Python writes them, as some clients do
    except (ValueError, UnicodeEncodeError):
        return
    check_answer(*in_process.call("POST", "/search", raw))


@hypothesis.settings(max_examples=100, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()),
                  doc=st.text(max_size=20), query=st.binary(max_size=40))
def test_any_bytes_and_paths_get_a_2xx_or_a_4xx(in_process, raw, doc, query):
    check_answer(*in_process.call("POST", "/search", raw))
    status, body = in_process.call("GET", "/doc/" + doc, query=query)
    assert 200 <= status < 500, (status, body[:300])


def test_serve_without_its_extra_names_every_missing_package(monkeypatch, tmp_path, capsys):
    import sys

    from retr.cli.main import main

    for name in ("uvicorn", "httptools"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    assert main(["serve", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert "(uvicorn, httptools are missing): pip install 'retr[serve]'" in err, err
    monkeypatch.setitem(sys.modules, "fastapi", None)
    assert main(["serve", str(tmp_path / "idx")]) == 2
    assert "(fastapi, uvicorn, httptools are missing)" in capsys.readouterr().err
