"""A bounded load test of `retr serve` on loopback, beside the same queries in-process.

Builds (or reuses) the dataset's index with BM25, starts `retr serve` in its own process on 127.0.0.1 (a free
port), then for each concurrency level runs that many client threads for a fixed duration, each on its own
keep-alive connection sending one query per request (POST /search, the chosen mode) and waiting for the answer.
Reports QPS, p50/p95/p99 and errors per level. The HTTP overhead at one client is measured in alternating passes
over the same queries, in-process (the Searcher the server uses) then over HTTP, while the server idles between
its requests: on a shared machine a pass-to-pass drift of ±0.5 ms falls on both sides instead of on one.

    python benchmarks/serve_load.py --dataset ../shared/datasets/scifact --mode hybrid --levels 1,8,32 --seconds 20

``--index FOLDER`` serves an index built beforehand (`retr index --bm25`) instead of retr's cached one: the same
folder can then be served by two checkouts of retr (``PYTHONPATH`` pointing at another one's package), to compare
them on one machine in alternating runs. The CPU is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from common import cpu, percentiles, write_result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 30.0) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


class Client:
    """One keep-alive HTTP/1.1 connection (as a service's clients hold them), reopened after an error. Each request
    goes out in one write, headers and body together, as HTTP client libraries with connection pools do
    (``http.client`` writes them apart, so the server would wake twice per request)."""

    def __init__(self, url: str):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.addr = (parts.hostname, parts.port)
        self.head = f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        self.sock: socket.socket | None = None

    def post(self, body: dict) -> int:
        import http.client

        data = json.dumps(body).encode()
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addr, timeout=30)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(f"{self.head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
            r = http.client.HTTPResponse(self.sock)
            r.begin()
            r.read()
            if r.will_close:
                self.close()
            return r.status
        except (OSError, http.client.HTTPException):
            self.close()
            return 0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def level(url: str, queries: list[str], concurrency: int, seconds: float, body: dict,
          samples: list[float] | None = None) -> dict:
    """``concurrency`` closed-loop clients for ``seconds``: each sends its next query once the last is answered;
    ``samples``: the answered requests' latencies (ms) are added to it."""
    lat: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        nonlocal errors
        conn = Client(url)
        j = i
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status = conn.post({**body, "query": queries[j % len(queries)]})
            ms = (time.perf_counter() - t0) * 1000.0
            with lock:
                if status == 200:
                    lat.append(ms)
                else:
                    errors += 1
            j += concurrency
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if samples is not None:
        samples += lat
    return {"concurrency": concurrency, "requests": len(lat) + errors, "errors": errors,
            "qps": len(lat) / wall, **percentiles(lat)}


def paired_overhead(url: str, folder, queries: list[str], body: dict, rounds: int) -> dict:
    """``rounds`` passes over ``queries``, each first in-process (this process, the server's own Searcher path,
    one query at a time) and then over HTTP (one keep-alive client): p50 of each side and the median of the
    per-query differences."""
    from retr.indexes.searcher import Searcher
    from retr.retrieval.encoder import EncoderConfig

    searcher = Searcher(folder, EncoderConfig())
    conn = Client(url)
    for q in queries[:10]:  # warm-up, untimed
        searcher.search_many([q], body["k"], body["mode"])
    inproc = np.zeros((rounds, len(queries)))
    http = np.zeros((rounds, len(queries)))
    errors = 0
    for r in range(rounds):
        for j, q in enumerate(queries):
            t0 = time.perf_counter()
            searcher.search_many([q], body["k"], body["mode"])
            t1 = time.perf_counter()
            errors += conn.post({**body, "query": q}) != 200
            inproc[r, j], http[r, j] = (t1 - t0) * 1000.0, (time.perf_counter() - t1) * 1000.0
    conn.close()
    searcher.close()
    return {"rounds": rounds, "queries": len(queries), "errors": errors,
            "in_process": percentiles(inproc.ravel().tolist()), "http": percentiles(http.ravel().tolist()),
            "median_paired_ms": float(np.median(http - inproc))}


def searches_on(metrics: str) -> dict[str, int]:
    """``retr_searches_total`` from the server's /metrics: searches by the thread they ran on."""
    import re

    return {m[1]: int(m[2]) for m in re.finditer(r'^retr_searches_total\{on="(\w+)"\} (\d+)$', metrics, re.M)}


def middleware_cost(peer: str | None, calls: int = 20000, rounds: int = 7) -> dict:
    """The per-request cost of the service's own ASGI layer (``Bounded``: Host and content-type checks, body
    bound, status counting) in this process, on a stub app that reads the body and answers 200 (no sockets, no
    search): µs per request for the app alone, behind this checkout's layer, and behind the layer of the
    ``serve/guard.py`` at ``peer`` (another checkout's, loaded beside this one), in alternating rounds; plus the
    read deadline the connection guard arms and cancels per request (``loop.call_later``)."""
    import asyncio
    import importlib.util

    from retr.serve.config import LOOPBACK_HOSTS
    from retr.serve.guard import Bounded
    from retr.serve.metrics import Metrics

    async def stub(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    body = b'{"query": "solar panels"}'
    scope = {"type": "http", "method": "POST", "path": "/search",
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"user-agent", b"bench")]}
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive():
        return message

    async def send(_message):
        pass

    layers = {"app alone": stub, "this checkout": Bounded(stub, 1 << 20, Metrics(), LOOPBACK_HOSTS)}
    if peer:
        spec = importlib.util.spec_from_file_location("peer_guard", peer)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        layers["peer"] = module.Bounded(stub, 1 << 20, module.Metrics())

    async def timed(app) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            await app(scope, receive, send)
        return (time.perf_counter() - t0) / calls * 1e6

    async def deadline() -> float:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for _ in range(calls):
            loop.call_later(30.0, print).cancel()
        return (time.perf_counter() - t0) / calls * 1e6

    us: dict[str, list[float]] = {name: [] for name in layers}
    us["read deadline"] = []
    loop = asyncio.new_event_loop()
    for _ in range(rounds):
        for name, app in layers.items():
            us[name].append(loop.run_until_complete(timed(app)))
        us["read deadline"].append(loop.run_until_complete(deadline()))
    loop.close()
    median = {name: float(np.median(v)) for name, v in us.items()}
    out = {"calls": calls, "rounds": rounds, "median_us": median, "peer": peer,
           "layer_us": median["this checkout"] - median["app alone"]}
    if peer:
        out["peer_layer_us"] = median["peer"] - median["app alone"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--mode", default="hybrid", choices=("bm25", "dense", "hybrid"))
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--seconds", type=float, default=20.0, help="per concurrency level")
    p.add_argument("--rounds", type=int, default=6, help="alternating in-process/HTTP passes for the overhead")
    p.add_argument("--index", default=None, help="serve this index folder (built with --bm25) instead of the cached one")
    p.add_argument("--label", default=None, help="a name for this run in the results (e.g. the commit served)")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `retr serve` (repeat; e.g. --serve-arg=--query-backend "
                        "--serve-arg=openvino)")
    p.add_argument("--middleware-only", action="store_true",
                   help="measure only the per-request cost of the ASGI layer (in-process, no server, no search)")
    p.add_argument("--peer-serve-app", default=None,
                   help="another checkout's serve/guard.py (cli/serve_app.py before it moved): its layer measured beside this one's")
    p.add_argument("--out", default="benchmarks/results/serve-load.json")
    args = p.parse_args(argv)

    from retr.eval.data import load_dataset
    from retr.indexes.build import IndexConfig, cached_index
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import BiEncoder

    if args.middleware_only:
        cost = middleware_cost(args.peer_serve_app)
        print(f"ASGI layer per request, median of {cost['rounds']} rounds of {cost['calls']} calls (µs): "
              + ", ".join(f"{name} {us:.2f}" for name, us in cost["median_us"].items())
              + f"; the layer itself: this checkout {cost['layer_us']:.2f} µs"
              + (f", peer {cost['peer_layer_us']:.2f} µs" if "peer_layer_us" in cost else "") + f"; CPU: {cpu()}")
        write_result(args.out, {"label": args.label, "cpu": cpu(), "load_average": os.getloadavg(),
                                "middleware": cost})
        return 0
    ds = load_dataset(args.dataset, "test", download=False)
    if args.index:
        folder = Path(args.index)
    else:
        cfg = IndexConfig(bm25=BM25Config())
        folder = cached_index(ds.name, ds.corpus, BiEncoder(cfg.encoder), cfg).folder
    queries = list(ds.queries.values())

    import retr

    results: dict = {"dataset": ds.name, "mode": args.mode, "k": args.k, "index": str(folder), "label": args.label,
                     # the retr package served (an older checkout's is a namespace package: no __file__)
                     "retr": str(Path(next(iter(retr.__path__))).resolve()), "cpu": cpu(),
                     "serve_args": args.serve_arg, "load_average": os.getloadavg(), "levels": []}
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "retr.cli.main", "-q", "serve", str(folder), "--port", str(port),
                               *args.serve_arg],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"retr serve did not start: {server.stderr.read()[-2000:]}")
            time.sleep(0.2)
        body = {"k": args.k, "mode": args.mode}
        for q in queries[:10]:  # warm-up, untimed
            _post(url + "/search", {**body, "query": q})
        for c in (int(x) for x in args.levels.split(",")):
            results["levels"].append(level(url + "/search", queries, c, args.seconds, body))
        # HTTP overhead at one client: in-process and over HTTP in alternating passes over the same queries
        # while the server idles between its requests, so that drift on a shared machine falls on both sides
        results["overhead"] = paired_overhead(url + "/search", folder, queries, body, args.rounds)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # where the server ran its searches
            results["searches_on"] = searches_on(r.read().decode())
    finally:
        server.terminate()
        server.wait(10)

    base = results["levels"][0]
    print(f"retr serve, {ds.name}, {args.mode}, k={args.k}, {args.seconds:.0f} s per level, 127.0.0.1")
    print(f"{'clients':>8} {'requests':>9} {'errors':>7} {'QPS':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for r in results["levels"]:
        print(f"{r['concurrency']:>8} {r['requests']:>9} {r['errors']:>7} {r['qps']:>8.1f} {r['p50']:>8.2f} "
              f"{r['p95']:>8.2f} {r['p99']:>8.2f}")
    ov = results["overhead"]
    print(f"one client, {ov['rounds']} alternating passes of {ov['queries']} queries: in-process p50 "
          f"{ov['in_process']['p50']:.2f} ms, HTTP p50 {ov['http']['p50']:.2f} ms; median per-query difference "
          f"{ov['median_paired_ms']:.2f} ms; searches by thread, all levels: {results['searches_on']}")
    overhead = ov["http"]["p50"] - ov["in_process"]["p50"]
    results["http_overhead_p50_ms"] = overhead
    results["throughput_ratio"] = {str(r["concurrency"]): r["qps"] / base["qps"] for r in results["levels"]}
    print(f"HTTP overhead at 1 client, p50: {overhead:.2f} ms (goal <= 1 ms); throughput vs 1 client: "
          + ", ".join(f"{c}: {x:.2f}x" for c, x in results["throughput_ratio"].items())
          + f"; errors: {sum(r['errors'] for r in results['levels'])}")
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
