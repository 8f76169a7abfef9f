"""`retr index --executor ray` against a real local Ray cluster started here on loopback: a head (no CPUs of its
own) and two worker nodes of one CPU each, every node a `ray start --block` process group that the fixture stops."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from retr.cli.main import main

from .conftest import DOCS

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_node(*args: str, env: dict) -> subprocess.Popen:
    ray_cli = Path(sys.executable).with_name("ray")
    return subprocess.Popen([str(ray_cli), "start", "--block", "--node-ip-address", "127.0.0.1",
                             "--object-store-memory", str(80 << 20), "--disable-usage-stats", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)


@pytest.fixture(scope="module")
def ray_cluster():
    """The head's address; the cluster stops (its process groups terminated) when the module's tests end."""
    port = _free_port()
    # one auth mode for the nodes and this process (the driver). A local `ray.init()` leaves ~/.ray/auth_token, and
    # `ray start` then turns token auth on, while this process read its mode when it imported ray (at collection,
    # before any fixture could set a token): they never connect. The cluster lives for this module's tests only.
    auth = {"RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": "120"}
    nodes = [_ray_node("--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard", "false", env=env)]
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:  # the head's GCS port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert nodes[0].poll() is None, f"ray head died: {nodes[0].stderr.read()[-2000:]}"
                assert time.time() < deadline, "ray head did not start"
                time.sleep(0.5)
        while True:  # the port answers before the GCS serves: join once it does
            try:
                ray.init(address=address, logging_level="WARNING", log_to_driver=False)
                break
            except (RuntimeError, ConnectionError):
                assert nodes[0].poll() is None, f"ray head died: {nodes[0].stderr.read()[-2000:]}"
                assert time.time() < deadline, "the ray head's GCS did not answer"
                time.sleep(1)
        try:
            for want in (2, 3):  # one worker at a time: two raylets starting at once overload two cores
                nodes.append(_ray_node("--address", address, "--num-cpus", "1", env=env))
                while sum(n["Alive"] for n in ray.nodes()) < want:
                    dead = [p for p in nodes if p.poll() is not None]
                    assert not dead, f"a ray node died while starting: {dead[0].stderr.read()[-3000:]}"
                    assert time.time() < deadline, "the ray workers did not join"
                    time.sleep(0.5)
        finally:
            ray.shutdown()
        yield address
    finally:
        for p in reversed(nodes):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in nodes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        # `ray start --head` leaves the head's address for later `ray.init()` calls to join: not this dead one
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _corpus(folder: Path, n: int = 160) -> Path:
    """``n`` documents of varied lengths made from the fixture's sentences (the tiny tokenizer knows their words)."""
    rng = random.Random(7)
    sentences = [text for _, _, text in DOCS if text]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            body = " ".join(rng.choice(sentences) for _ in range(rng.randint(1, 6)))
            fh.write(json.dumps({"_id": f"doc{i}", "title": rng.choice(DOCS)[1], "text": body}) + "\n")
    return path


def _vectors(folder: Path) -> np.ndarray:
    import faiss

    from retr.indexes.dense import FAISS_FILE

    index = faiss.read_index(str(folder / FAISS_FILE))
    return index.reconstruct_n(0, index.ntotal)


def test_a_ray_build_equals_the_local_build(ray_cluster, tiny_bi_encoder, tmp_path, capsys):
    corpus = _corpus(tmp_path / "c", 600)  # ~10 encoding batches: three blocks for two actors
    common = ["index", "--corpus", str(corpus), "--model", str(tiny_bi_encoder), "--backend", "onnx", "--no-cache"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--executor", "ray", "--ray-address", ray_cluster,
                 "--ray-actors", "2"]) == 0
    local, distributed = _vectors(tmp_path / "local"), _vectors(tmp_path / "ray")
    assert local.shape == distributed.shape == (600, 32)
    assert np.array_equal(local, distributed), np.abs(local - distributed).max()  # same graph, same batches
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    executor = manifest["dense"]["encode"]["executor"]
    assert executor["name"] == "ray" and executor["actors"] == 2 and executor["blocks"] >= 2
    assert manifest["config"]["executor"]["name"] == "ray"
    local_manifest = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert manifest["dense"]["encode"]["graph"] == local_manifest["dense"]["encode"]["graph"]
    capsys.readouterr()
    for folder in ("local", "ray"):
        assert main(["search", str(tmp_path / folder), "wolves in the tundra", "--json", "--backend", "onnx"]) == 0
    a, b = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines())
    assert [h["id"] for h in a["results"]] == [h["id"] for h in b["results"]]


def test_a_worker_killed_mid_job_still_encodes_every_document_once(ray_cluster, tiny_bi_encoder, tmp_path):
    from retr.indexes.corpus import CorpusFormat, load_corpus
    from retr.indexes.ray_encode import encode_on_ray
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    docs = load_corpus(_corpus(tmp_path / "c", 240), CorpusFormat()).docs
    texts = [d.full_text() for d in docs]
    # a small token budget: ~100 batches, one per task, so that the job is still running when a worker dies
    encoder = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx", token_budget=64))
    killed: list[int] = []
    after_kill: list[int] = []

    def kill_first_worker(block):
        if not killed:
            killed.append(int(block["pid"][0]))
            os.kill(killed[0], signal.SIGKILL)
        else:
            after_kill.extend(block["pid"].tolist())

    encoded = encode_on_ray(encoder, texts, address=ray_cluster, actors=2, batches_per_task=1,
                            on_block=kill_first_worker)
    assert killed and after_kill, "the worker must die while the job still has blocks to deliver"
    assert any(pid not in killed for pid in after_kill)
    expected = encoder.encode_corpus(texts).embeddings
    assert np.array_equal(encoded.embeddings, expected)  # every row there, each written once (counted inside)
    assert encoded.executor["batches"] > 50
