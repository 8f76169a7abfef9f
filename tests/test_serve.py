"""`retr serve` for real: uvicorn on 127.0.0.1 (a free port), requests over HTTP, bounded inputs, generations."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from retr.cli.main import main

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from .serving import Server, on_disk_generation  # noqa: E402 - after the skips: it imports uvicorn


@pytest.fixture
def served(tiny_dataset, tiny_bi_encoder, tmp_path):
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--bm25"]) == 0
    server = Server(idx, ServeConfig(encoder=EncoderConfig(backend="onnx"), max_batch=4))
    yield server, idx
    server.stop()


def test_search_health_metrics_and_docs_over_http(served, capsys):
    server, idx = served
    status, health = server.request("/healthz")
    generation = on_disk_generation(idx)
    assert status == 200 and health["documents"] == 16 and health["status"] == "ok"
    assert (health["generation"], health["opened"], health["refused"]) == (generation, 1, None)
    status, one = server.request("/search", {"query": "solar panels", "k": 3, "mode": "hybrid"})
    assert status == 200 and one["pipeline"] == "hybrid" and len(one["results"]) == 3
    assert main(["search", str(idx), "solar panels", "-k", "3", "--mode", "hybrid", "--json", "--backend", "onnx"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in one["results"]] == [r["id"] for r in cli["results"]]  # the CLI's answer, same shape
    assert set(one["results"][0]) == set(cli["results"][0]) == {"rank", "id", "score", "title", "text", "metadata"}
    status, batch = server.request("/search", {"queries": ["wolves", "water"], "k": 2, "mode": "bm25"})
    assert status == 200 and [len(r["results"]) for r in batch["results"]] == [2, 2]
    first = one["results"][0]["id"]
    status, doc = server.request(f"/doc/{first}")
    assert status == 200 and doc["id"] == first and doc["text"]
    status, text = server.request("/metrics")
    assert status == 200 and 'retr_requests_total{path="/search",status="200"} 2' in text
    assert 'retr_stage_latency_seconds_count{stage="total"} 3' in text
    assert f"retr_index_generation {generation}\n" in text and "retr_index_refused 0\n" in text
    # one query from a lone client on the loop, the batch on the search threads
    assert 'retr_searches_total{on="loop"} 1' in text and 'retr_searches_total{on="threads"} 1' in text
    status, page = server.request("/")
    assert status == 200 and "<form" in page and "/search" in page
    status, spec = server.request("/openapi.json")
    assert status == 200 and "/search" in spec["paths"]


@pytest.mark.parametrize("body,status,message", [
    ({"query": ""}, 422, "query"),
    ({"query": "   "}, 400, "empty"),
    ({"query": "\u200b\u0000"}, 400, "no searchable characters"),
    ({"query": "solar", "k": "10"}, 422, "k"),
    ({"query": "solar", "k": 10.5}, 422, "k"),
    ({"query": "solar", "mode": None}, 422, "mode"),
    ({"query": "solar", "fusion": "max"}, 422, "fusion"),
    ({"query": "solar", "fusion_depth": 0}, 422, "fusion_depth"),
    ({"query": "solar", "fusion_depth": "5"}, 422, "fusion_depth"),
    ({"query": "solar", "filter": "x"}, 422, "filter"),
    ({"query": "x" * 2001}, 422, "query"),
    ({"query": "solar", "k": 0}, 422, "k"),
    ({"query": "solar", "k": 100000}, 422, "k"),
    ({"queries": ["a", "b", "c", "d", "e"]}, 422, "queries"),
    ({"query": "solar", "queries": ["a"]}, 422, "either 'query' or 'queries'"),
    ({}, 422, "either 'query' or 'queries'"),
    ({"query": "solar", "mode": "colbert"}, 422, "mode"),
    ({"query": "solar", "rerank": True}, 400, "no cross-encoder"),
    ({"query": "solar", "extra": 1}, 422, "extra"),
    ({"query": ["not", "a", "string"]}, 422, "query"),
])
def test_bad_requests_get_a_4xx_with_a_json_error(served, body, status, message):
    server, _ = served
    got, answer = server.request("/search", body)
    assert got == status and message in answer["error"], (got, answer)


def test_get_search_answers_as_post_and_checks_its_parameters_alike(served):
    from urllib.parse import urlencode

    server, _ = served
    status, posted = server.request("/search", {"query": "solar panels", "k": 2, "mode": "bm25"})
    got, answer = server.request("/search?" + urlencode([("q", "solar panels"), ("k", "2"), ("mode", "bm25")]))
    assert status == got == 200, answer
    assert [h["id"] for h in answer["results"]] == [h["id"] for h in posted["results"]]
    assert {k: v for k, v in answer.items() if k != "latency_ms"} == {k: v for k, v in posted.items()
                                                                      if k != "latency_ms"}
    status, hybrid = server.request("/search?q=wolves")  # the defaults: hybrid, k 10
    assert status == 200 and hybrid["pipeline"] == "hybrid" and len(hybrid["results"]) == 10
    for query, want, message in [
        ("", 422, "query"), ("q=", 422, "query"), ("q=%20%20", 400, "empty"),
        ("q=solar&k=ten", 422, "k"), ("q=solar&k=0", 422, "k"), ("q=solar&k=100000", 422, "k"),
        ("q=solar&k=1.5", 422, "k"), ("q=solar&k=2&k=3", 400, "give 'k' once"),
        ("q=solar&mode=colbert", 422, "mode"), ("q=solar&fusion=max", 422, "fusion"),
        ("q=solar&fusion_depth=0", 422, "fusion_depth"), ("q=solar&rerank=maybe", 422, "rerank"),
        ("q=solar&rerank=true", 400, "no cross-encoder"), ("q=solar&filter=lang", 400, "FIELD=VALUE"),
        ("q=solar&filter=lang=en", 400, "no document has a field 'lang'"),  # the filter reaches the search
        ("q=solar&extra=1", 422, "extra"), ("q=" + "x" * 2001, 422, "query"),
        ("query=solar", 400, "q=..."), ("q=solar&queries=a", 400, "q=..."),
    ]:
        got, answer = server.request("/search?" + query)
        assert got == want and message in answer["error"], (query, got, answer)


def test_malformed_and_oversized_bodies(served):
    server, _ = served
    status, answer = server.request("/search", raw=b"{not json")
    assert status == 422 and "error" in answer
    # a body declared over the bound is answered before it is read (a client still sending it could see the
    # connection close instead of the answer, so this client declares 2 MiB and sends two bytes)
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/search")
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(2 << 20))
    conn.endheaders(b"{}")
    r = conn.getresponse()
    assert r.status == 413 and "request body" in json.loads(r.read())["error"]
    conn.close()
    status, answer = server.request("/doc/NOPE")
    assert status == 404 and "no document" in answer["error"]
    status, health = server.request("/healthz")
    assert status == 200  # still serving


def test_concurrent_requests_share_one_index_without_errors(served):
    server, _ = served
    queries = ["solar panels", "wolves in the tundra", "coffee and tea", "volcanoes"] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda q: server.request("/search", {"query": q, "k": 3}), queries))
    assert all(s == 200 for s, _ in answers)
    by_query = {}
    for q, (_, a) in zip(queries, answers, strict=True):
        by_query.setdefault(q, set()).add(tuple(r["id"] for r in a["results"]))
    assert all(len(v) == 1 for v in by_query.values()), "the same query must get the same answer under load"


def test_a_rebuilt_index_is_picked_up_as_a_new_generation(served, tiny_bi_encoder, tmp_path):
    server, idx = served
    status, before = server.request("/search", {"query": "quasar telescopes", "k": 1, "mode": "bm25"})
    assert status == 200 and before["results"] == []
    corpus = tmp_path / "more.jsonl"
    corpus.write_text(json.dumps({"_id": "new1", "title": "Quasars", "text": "quasar telescopes and galaxies"}) + "\n"
                      + json.dumps({"_id": "new2", "title": "Tea", "text": "green tea leaves"}) + "\n")
    assert main(["index", "--corpus", str(corpus), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--bm25"]) == 0
    server.wait_for(lambda health: health["opened"] == 2)  # opened and warmed off the event loop, then served
    status, after = server.request("/search", {"query": "quasar telescopes", "k": 1, "mode": "bm25"})
    assert status == 200 and after["results"][0]["id"] == "new1"
    health = server.request("/healthz")[1]
    assert health["opened"] == 2 and health["generation"] == on_disk_generation(idx)


def test_a_new_generation_warms_off_the_loop_while_the_old_one_answers(served, tmp_path, monkeypatch):
    """While the next generation warms up (held here, on the watcher's thread) every request is answered by the
    served one; then one swap; the old generation is closed once the last request holding it ends."""
    import threading

    from retr.serve import generations as module

    server, idx = served
    generations = server.app.state.generations
    warming, release, threads = threading.Event(), threading.Event(), []
    warm_up = module.warm_up

    def held(searcher, cfg):
        threads.append(threading.current_thread().name)
        warming.set()
        assert release.wait(60)
        warm_up(searcher, cfg)

    monkeypatch.setattr(module, "warm_up", held)
    before = server.request("/healthz")[1]
    in_flight = generations.acquire()  # a request still running on the old generation when it is replaced
    corpus = tmp_path / "added.jsonl"
    corpus.write_text(json.dumps({"_id": "pulsar1", "title": "Pulsars", "text": "pulsar radio beams"}) + "\n")
    assert main(["add", str(idx), "--corpus", str(corpus)]) == 0
    assert warming.wait(60), "the watcher did not start opening the new generation"
    for _ in range(3):  # answered while the new generation warms: by the old one
        status, found = server.request("/search", {"query": "pulsar radio", "k": 3, "mode": "bm25"})
        assert status == 200 and "pulsar1" not in [r["id"] for r in found["results"]]
        assert server.request("/healthz")[1]["generation"] == before["generation"]
    release.set()
    server.wait_for(lambda health: health["opened"] == 2)
    status, found = server.request("/search", {"query": "pulsar radio", "k": 3, "mode": "bm25"})
    assert status == 200 and found["results"][0]["id"] == "pulsar1"
    health = server.request("/healthz")[1]
    assert (health["generation"], health["opened"]) == (before["generation"] + 1, 2)
    assert threads == ["retr-generations"]  # warmed on the watcher's thread, once
    assert not in_flight.searcher.closed  # replaced, but still held by its request
    generations.release(in_flight)
    assert in_flight.searcher.closed
    with generations.lease() as searcher:
        assert not searcher.closed


def test_a_streamed_body_over_the_bound_gets_413(served):
    """No content-length (chunked): the bound is enforced on the bytes as they arrive."""
    import http.client
    from urllib.parse import urlsplit

    server, _ = served
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    chunks = iter([b'{"query": "', b"x" * (600 << 10), b"x" * (600 << 10), b'"}'])
    conn.request("POST", "/search", body=chunks, headers={"content-type": "application/json"}, encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and "request body" in json.loads(r.read())["error"]
    conn.close()
    assert server.request("/healthz")[0] == 200


def test_added_and_deleted_documents_are_served_as_a_new_generation(served, tmp_path):
    server, idx = served
    generation = server.request("/healthz")[1]["generation"]
    corpus = tmp_path / "added.jsonl"
    corpus.write_text(json.dumps({"_id": "pulsar1", "title": "Pulsars", "text": "pulsar radio beams"}) + "\n")
    assert main(["add", str(idx), "--corpus", str(corpus)]) == 0
    server.wait_for(lambda health: health["opened"] == 2)
    status, found = server.request("/search", {"query": "pulsar radio", "k": 1, "mode": "hybrid"})
    assert status == 200 and found["results"][0]["id"] == "pulsar1"
    (tmp_path / "gone.txt").write_text("pulsar1\n")
    assert main(["delete", str(idx), "--ids", str(tmp_path / "gone.txt")]) == 0
    server.wait_for(lambda health: health["opened"] == 3)
    status, after = server.request("/search", {"query": "pulsar radio", "k": 5, "mode": "bm25"})
    assert status == 200 and "pulsar1" not in [r["id"] for r in after["results"]]
    assert server.request("/doc/pulsar1")[0] == 404
    health = server.request("/healthz")[1]
    assert (health["generation"], health["opened"]) == (generation + 2, 3) == (on_disk_generation(idx), 3)


def test_a_lone_clients_query_runs_on_the_event_loop_and_concurrent_ones_on_the_pool():
    import asyncio
    import threading

    from retr.serve.app import Dispatch

    pool = ThreadPoolExecutor(2, thread_name_prefix="retr-search")
    connections = [1]

    def where():
        return threading.current_thread().name

    async def go(brief: bool):
        loop_thread = threading.current_thread().name
        return (await dispatch.run(where, brief=brief)) == loop_thread

    dispatch = Dispatch(pool, 5.0, lambda: connections[0])
    assert asyncio.run(go(True)) is True  # one connection, brief work, nothing in flight: on the loop
    assert asyncio.run(go(False)) is False  # a batch or a reranked query: the pool (the deadline holds)
    connections[0] = 2
    assert asyncio.run(go(True)) is False  # another connection may be waiting for the loop
    assert Dispatch(pool, 5.0, None).open_connections is None
    assert asyncio.run(Dispatch(pool, 5.0, None).run(where, brief=True)).startswith("retr-search")

    async def overlapping():  # a query arriving while a pool search is in flight does not take the loop
        started, release = threading.Event(), threading.Event()

        def slow():
            started.set()
            release.wait(5)
            return where()

        connections[0] = 2
        first = asyncio.ensure_future(dispatch.run(slow, brief=True))
        while not started.is_set():
            await asyncio.sleep(0.01)
        connections[0] = 1  # the other client is gone, but its search is still running
        second = await dispatch.run(where, brief=True)
        release.set()
        return await first, second

    first, second = asyncio.run(overlapping())
    assert first.startswith("retr-search") and second.startswith("retr-search")
    assert (dispatch.inline, dispatch.pooled) == (1, 4)
    pool.shutdown()


def test_served_searches_take_the_loop_for_one_client_and_the_pool_under_load(served):
    server, _ = served
    dispatch = server.app.state.dispatch
    conn = __import__("http.client").client.HTTPConnection(server.url.removeprefix("http://"), timeout=30)
    for q in ("solar panels", "volcanoes", "coffee"):  # one keep-alive connection: the server holds only it
        conn.request("POST", "/search", json.dumps({"query": q, "k": 3}), {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["results"]
    conn.close()
    assert (dispatch.inline, dispatch.pooled) == (3, 0)
    test_concurrent_requests_share_one_index_without_errors(served)  # 8 clients at once: same answers, no errors
    assert dispatch.inline + dispatch.pooled == 3 + 32
    assert dispatch.pooled > 0, "concurrent clients' searches must go to the pool"


def test_the_service_and_the_cli_agree_on_a_request_with_no_options(served, capsys):
    """One request value, one set of defaults (retr.retrieval.request): the same hits from both doors."""
    from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE

    server, idx = served
    status, http = server.request("/search", {"query": "wolves in the tundra"})
    assert main(["search", str(idx), "wolves in the tundra", "--json", "--backend", "onnx"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert status == 200 and http["pipeline"] == cli["pipeline"] == DEFAULT_MODE and http["k"] == DEFAULT_K
    assert [r["id"] for r in http["results"]] == [r["id"] for r in cli["results"]]


def test_the_service_and_the_cli_agree_on_a_fusion_depth(served, capsys):
    """`fusion_depth` in a body and `--fusion-depth` on the command line: the same hits and scores, other than the
    default depth's."""
    server, idx = served
    query = "solar electricity for the night"
    status, http = server.request("/search", {"query": query, "k": 2, "fusion_depth": 2})
    assert main(["search", str(idx), query, "-k", "2", "--fusion-depth", "2", "--json", "--backend", "onnx"]) == 0
    cli = json.loads(capsys.readouterr().out)
    status_default, default = server.request("/search", {"query": query, "k": 2})
    assert status == status_default == 200
    hits = [(r["id"], r["score"]) for r in http["results"]]
    assert hits == [(r["id"], r["score"]) for r in cli["results"]]
    assert hits != [(r["id"], r["score"]) for r in default["results"]]
