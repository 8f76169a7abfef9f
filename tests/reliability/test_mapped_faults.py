"""Fault injection on a live generation's parts: every file of it truncated in turn (to nothing, and to half its
size: a backup restored with ``cp``, which truncates and then writes) under a reader (``retr.Index`` in a child
process) and under `retr serve`, for each dense kind that maps a file (flat, IVF-PQ, lean). No process may die
(a part read through a memory map past its end was SIGBUS); each request answers as before the damage or fails
with one line naming the part; the service answers 503 for what needs the damaged part and `/healthz` says
``degraded`` until the file is restored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import DOCS
from ..test_serve_safety import Process
from .test_faults import _run, _write_corpus

KINDS = ("flat", "ivfpq", "lean")
MODES = ("dense", "bm25", "hybrid")
QUERY = "solar wolves water"

# the reader: opens each folder it is handed, searches every mode (each hit's text read from the doc store), waits
# for the damage, then searches again; every answer is a JSON line, every error one line
READER = r"""
import json, sys
import retr
from retr.retrieval.errors import RetrError

def answers(index):
    out = {}
    for mode in ("dense", "bm25", "hybrid"):
        try:
            out[mode] = [[h.id, round(h.score, 5), h.text] for h in index.search("solar wolves water", k=5, mode=mode).hits]
        except RetrError as e:
            out[mode] = "error: " + str(e)
    return out

for line in sys.stdin:
    index = retr.Index.load(line.strip(), backend="onnx")
    print(json.dumps(answers(index)), flush=True)
    sys.stdin.readline()  # the part is cut short now
    print(json.dumps(answers(index)), flush=True)
    index.close()
"""


@pytest.fixture(scope="module")
def built(tiny_bi_encoder, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mapped-faults")
    corpus = _write_corpus(root / "corpus.jsonl", DOCS)
    out = {}
    for kind in KINDS:
        out[kind] = root / f"pristine-{kind}"
        rc, _, err = _run(["index", "--corpus", str(corpus), "--out", str(out[kind]), "--model", str(tiny_bi_encoder),
                           "--backend", "onnx", "--bm25", "--kind", kind])
        assert rc == 0, err
    return out


def _parts(folder: Path) -> list[Path]:
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def _cuts(size: int) -> tuple[int, ...]:
    return (0, size // 2) if size > 1 else (0,)


def _judge_answer(before, after, part: Path, tally) -> None:
    """An answer after the damage: the one before it, or one line naming the damaged part."""
    if isinstance(after, str):
        assert after.startswith("error: ") and "\n" not in after and str(part) in after, after
        tally["truncation_errors"] += 1
    else:
        assert after == before, f"{part}: a wrong answer under a damaged part"
        tally["truncation_unchanged"] += 1


@pytest.mark.parametrize("kind", KINDS)
def test_every_part_cut_short_under_a_live_reader_is_an_error_never_a_dead_process(built, kind, tmp_path, tally):
    """On 11c4983 the doc store, its offsets, BM25's three arrays, an IVF-PQ index's lists and a lean index's
    vectors killed the reader with SIGBUS (exit -7)."""
    pristine = built[kind]
    child = subprocess.Popen([sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        for rel in _parts(pristine):
            for cut in _cuts((pristine / rel).stat().st_size):
                live = tmp_path / "live"
                shutil.rmtree(live, ignore_errors=True)
                shutil.copytree(pristine, live)
                child.stdin.write(f"{live}\n")
                child.stdin.flush()
                line = child.stdout.readline()
                if not line:  # the reader died on an undamaged copy: what it said is the failure
                    pytest.fail(f"{kind}: the reader stopped before {rel} was cut: {child.stderr.read()[-2000:]}")
                before = json.loads(line)
                assert all(isinstance(v, list) for v in before.values()), before
                os.truncate(live / rel, cut)
                tally["truncations"] += 1
                child.stdin.write("go\n")
                child.stdin.flush()
                line = child.stdout.readline()
                if not line:
                    tally["deaths"] += 1
                    pytest.fail(f"{kind}: {rel} cut to {cut} bytes killed the reader (exit {child.wait()})")
                after = json.loads(line)
                for mode in MODES:
                    _judge_answer(before[mode], after[mode], live / rel, tally)
        child.stdin.close()
        assert child.wait(60) == 0, child.stderr.read()[-2000:]  # never a signal (negative)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _served(server: Process) -> dict:
    """Every route a part is read by: a search in each mode, a document, the health."""
    out = {}
    for mode in MODES:
        status, body = server.post({"query": QUERY, "k": 5, "mode": mode})
        body.pop("latency_ms", None)  # the time each stage took: the one field that differs between two answers
        out[mode] = status, body
    status, body = server.get("/doc/d1")
    out["doc"] = (status, json.loads(body))
    status, body = server.get("/healthz")
    out["healthz"] = (status, json.loads(body))
    return out


def _health_when(server: Process, status: str, within_s: float = 30.0) -> None:
    """Wait until `/healthz` says ``status``: a mapped part's damage shows at once, a changed ``manifest.json`` once
    the server's watcher has looked (every 0.5 s) and tried to open it, off the event loop."""
    deadline = time.monotonic() + within_s
    while json.loads(server.get("/healthz")[1])["status"] != status and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("kind", KINDS)
def test_every_part_cut_short_under_retr_serve_is_a_503_and_healthz_degraded(built, kind, tmp_path, tally):
    """`retr serve` (a process on 127.0.0.1): each part of its generation cut short, requests made, the part
    restored in place (as ``cp`` does). On 11c4983 the service died of SIGBUS with nothing in its log, and
    `/healthz` never said degraded."""
    live = tmp_path / "live"
    shutil.copytree(built[kind], live)
    server = Process(live)
    try:
        baseline = _served(server)
        assert baseline["healthz"][1]["status"] == "ok" and all(baseline[m][0] == 200 for m in MODES)
        for rel in _parts(live):
            original = (live / rel).read_bytes()
            for cut in _cuts(len(original)):
                os.truncate(live / rel, cut)
                tally["truncations"] += 1
                _health_when(server, "degraded")
                got = _served(server)
                assert server.proc.poll() is None, f"{kind}: {rel} cut to {cut} bytes killed `retr serve`"
                health = got.pop("healthz")[1]
                assert health["status"] == "degraded", (rel, cut, health)
                for what, (status, body) in got.items():
                    if status == 200:
                        assert body == baseline[what][1], (rel, cut, what)
                        tally["truncation_unchanged"] += 1
                    else:
                        assert status == 503 and set(body) == {"error"} and str(rel) in body["error"], \
                            (rel, cut, what, status, body)
                        tally["truncation_errors"] += 1
                (live / rel).write_bytes(original)  # restored in place, as `cp` does
                _health_when(server, "ok")
                again = _served(server)
                assert again["healthz"][1]["status"] == "ok", (rel, again["healthz"])
                assert {k: v for k, v in again.items() if k != "healthz"} == \
                    {k: v for k, v in baseline.items() if k != "healthz"}, rel
    finally:
        server.stop()
