"""A real uvicorn server of an index folder on 127.0.0.1 (a free port) in a thread, as `retr serve` makes it, and a
small HTTP client for tests."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request


class Server:
    def __init__(self, folder, cfg):
        from retr.cli.serve import check_reranker
        from retr.serve.app import uvicorn_server

        check_reranker(folder, cfg)  # as `retr serve` does before it opens the index
        self.server = uvicorn_server(folder, cfg, host="127.0.0.1", port=0)
        self.app = self.server.config.app
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def request(self, path: str, body=None, raw: bytes | None = None, headers=None) -> tuple[int, object]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def wait_for(self, healthy) -> dict:
        """``/healthz`` once ``healthy(it)`` holds, or after 60 s (a new generation is opened and warmed off the
        event loop before it is served)."""
        deadline = time.time() + 60
        while True:
            health = self.request("/healthz")[1]
            if healthy(health) or time.time() > deadline:
                return health
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def on_disk_generation(folder) -> int:
    """The generation of the index folder on disk, as retr reads it (not the server's count of opens)."""
    from retr.indexes.shards import open_index

    index = open_index(folder)
    try:
        return index.generation
    finally:
        index.close()
