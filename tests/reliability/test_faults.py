"""Fault injection: kill -9 during builds, every corruption of every file of an index folder and of every cache
entry, concurrent builds, and a table of bad inputs. Each must end in a clean one-line error or a transparent
rebuild: never a traceback, never a wrong result, never data lost."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from retr.cli.main import main

from ..conftest import DOCS, write_beir

MODES = ("dense", "bm25", "hybrid")
SEARCH_QUERIES = ("solar panels electricity", "wolves in the tundra", "hot water for coffee")


def _run(argv: list[str]) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr). An exception escaping main is a traceback: the test fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[retr]")]


def _write_corpus(path: Path, docs) -> Path:
    path.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs))
    return path


class Env:
    def __init__(self, root: Path, model: Path):
        self.root = root
        self.model = str(model)
        self.corpus = _write_corpus(root / "corpus.jsonl", DOCS)
        extra = [(f"x{i}", "Extra", f"extra document number {i} about solar wolves and coffee") for i in range(5)]
        self.corpus2 = _write_corpus(root / "corpus2.jsonl", DOCS + extra)
        self.pristine = root / "pristine"
        assert self.build(self.corpus, self.pristine)[0] == 0
        self.baseline = self.search_all(self.pristine)

    def index_argv(self, corpus: Path, out: Path) -> list[str]:
        return ["index", "--corpus", str(corpus), "--out", str(out), "--model", self.model, "--backend", "onnx",
                "--bm25"]

    def build(self, corpus: Path, out: Path) -> tuple[int, str, str]:
        return _run(self.index_argv(corpus, out))

    def search_all(self, idx: Path, queries=SEARCH_QUERIES) -> dict:
        """Every mode x query as `retr search --json` prints it (ids and scores), or the error it gave."""
        results = {}
        for mode in MODES:
            for q in queries:
                rc, out, err = _run(["search", str(idx), q, "--mode", mode, "--json", "-k", "5", "--backend", "onnx"])
                if rc != 0:
                    return {"error": (rc, _error_lines(err))}
                results[(mode, q)] = [(r["id"], round(r["score"], 5)) for r in json.loads(out)["results"]]
        return results

    def fresh_copy(self, name: str) -> Path:
        dst = self.root / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(self.pristine, dst)
        return dst


@pytest.fixture(scope="module")
def env(tiny_bi_encoder, tmp_path_factory):
    return Env(tmp_path_factory.mktemp("faults"), tiny_bi_encoder)


def _judge(env: Env, got: dict, tally, what: str) -> None:
    """A corrupted folder either gives a clean one-line error or exactly the pristine results."""
    if "error" in got:
        rc, lines = got["error"]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("retr: error: "), (what, got)
        tally["clean_errors"] += 1
    else:
        if got != env.baseline:
            tally["wrong_results"] += 1
        assert got == env.baseline, f"{what}: a wrong result"
        tally["unchanged"] += 1


# -- kill -9 ---------------------------------------------------------------------------------------------------
def test_kill_9_during_builds_never_damages_the_previous_index(env, tally):
    idx = env.root / "killed" / "idx"
    idx.parent.mkdir()
    assert env.build(env.corpus, idx)[0] == 0
    baseline2 = None
    cmd = [sys.executable, "-m", "retr.cli.main", "-q", *env.index_argv(env.corpus2, idx)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=env.root)  # a whole build, timed: the kill window
    full = time.perf_counter() - t0
    baseline2 = env.search_all(idx)
    assert baseline2 != env.baseline and "error" not in baseline2
    assert env.build(env.corpus, idx)[0] == 0
    rng = random.Random(0)

    def first(results: dict) -> dict:
        return {k: v for k, v in results.items() if k[1] == SEARCH_QUERIES[0]}

    for i in range(20):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=env.root)
        if i % 2:  # at a random moment of the whole process
            time.sleep(rng.uniform(0.05, full))
        else:  # while it writes: once its temporary folder exists, within the next few milliseconds
            deadline = time.perf_counter() + 2 * full
            while proc.poll() is None and time.perf_counter() < deadline \
                    and not any(p.name.endswith(".building") for p in idx.iterdir()):  # its new generation
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if any(p.name.startswith(".gen-") for p in idx.iterdir()):
            tally["kills_mid_write"] += 1  # it died with its generation's temporary folder on disk
        got = env.search_all(idx, SEARCH_QUERIES[:1])
        assert got in (first(env.baseline), first(baseline2)), f"kill {i}: the index is neither the old nor the new one"
        if got == first(baseline2):  # the kill came after the rename: the new index is whole; put the old one back
            assert env.build(env.corpus, idx)[0] == 0
        if i % 5 == 4:  # the next build removes what killed builds left
            assert env.build(env.corpus, idx)[0] == 0
            assert sorted(p.name for p in idx.parent.iterdir()) == ["idx"], list(idx.parent.iterdir())
            left = sorted(p.name for p in idx.iterdir())
            assert left[-1] == "manifest.json" and all(n.startswith("gen-") for n in left[:-1]), left
            assert env.search_all(idx) == env.baseline
        tally["kills"] += 1
    assert env.build(env.corpus, idx)[0] == 0
    assert sorted(p.name for p in idx.parent.iterdir()) == ["idx"]


# -- corruption of every file of an index folder ----------------------------------------------------------------
def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: max(0, p.stat().st_size // 2)])


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    if data:
        data[len(data) // 2] ^= 0x5A
    p.write_bytes(bytes(data))


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _append(p: Path) -> None:
    p.write_bytes(p.read_bytes() + b"\x00garbage\n")


CORRUPTIONS = {"truncate": _truncate, "flip": _flip, "empty": _empty, "append": _append}


def test_every_corruption_of_every_index_file_is_an_error_or_harmless(env, tally):
    files = sorted(p.relative_to(env.pristine) for p in env.pristine.rglob("*") if p.is_file())
    assert {"manifest.json", "dense.faiss", "ids.json", "docstore.jsonl", "docstore.offsets.npy"} <= {
        str(f) for f in files}
    for rel in files:
        for name, corrupt in CORRUPTIONS.items():
            idx = env.fresh_copy("corrupt")
            corrupt(idx / rel)
            _judge(env, env.search_all(idx), tally, f"{name} {rel}")
            tally["corruptions"] += 1


def test_reordered_ids_shifted_offsets_and_bad_manifests_are_refused(env, tally):
    cases = {}
    idx = env.fresh_copy("reordered")
    ids = json.loads((idx / "ids.json").read_text())
    ids[0], ids[1] = ids[1], ids[0]  # same size, every result mislabelled if trusted
    (idx / "ids.json").write_text(json.dumps(ids, ensure_ascii=False))
    cases["reordered ids.json"] = idx
    idx = env.fresh_copy("offsets")
    off = np.load(idx / "docstore.offsets.npy")
    off[1:-1] += 3
    np.save(idx / "docstore.offsets.npy", off)
    cases["shifted offsets"] = idx
    for label, manifest in (("list manifest", [1, 2]), ("manifest without dense", {"format": "retr-index",
                                                                                    "format_version": 1})):
        idx = env.fresh_copy(label.replace(" ", "-"))
        (idx / "manifest.json").write_text(json.dumps(manifest))
        cases[label] = idx
    idx = env.fresh_copy("dim-as-string")
    m = json.loads((idx / "manifest.json").read_text())
    m["dense"]["dim"] = "32"
    (idx / "manifest.json").write_text(json.dumps(m))
    cases["dim as a string"] = idx
    for label, folder in cases.items():
        got = env.search_all(folder)
        assert "error" in got, f"{label}: not refused"
        _judge(env, got, tally, label)
        tally["corruptions"] += 1


# -- corruption of every cache entry ----------------------------------------------------------------------------
def _cache() -> Path:
    return Path(os.environ["RETR_CACHE"])


def test_every_corruption_of_every_cache_entry_is_rebuilt_transparently(env, tally, caplog):
    caplog.set_level("WARNING", logger="retr")
    assert env.build(env.corpus, env.root / "warm")[0] == 0  # this test's own cache: an embedding entry, graphs
    emb_dirs = list((_cache() / "embeddings").iterdir())
    graph_dirs = [d for d in (_cache() / "onnx").iterdir() if d.is_dir()]
    assert emb_dirs and graph_dirs

    def noise_and_nan(p: Path) -> None:
        a = np.load(p)
        b = np.random.default_rng(0).normal(size=a.shape).astype(np.float32)
        b[0] = np.nan
        np.save(p, b)

    targets = [(d / "embeddings.npy", f) for d in emb_dirs for f in (noise_and_nan, _truncate, _flip)]
    targets += [(d / "meta.json", f) for d in emb_dirs for f in (_flip, _empty)]
    for d in graph_dirs:
        for f in sorted(p for p in d.iterdir() if p.is_file()):
            targets += [(f, _truncate), (f, _flip)]
    for i, (path, corrupt) in enumerate(targets):
        corrupt(path)
        caplog.clear()
        out = env.root / f"rebuilt-{i}"
        rc, _, err = env.build(env.corpus, out)
        assert rc == 0, (path, corrupt.__name__, err)
        got = env.search_all(out)
        if got != env.baseline:
            tally["wrong_results"] += 1
        assert got == env.baseline, f"{corrupt.__name__} {path}: a wrong result after the rebuild"
        shutil.rmtree(out)
        tally["rebuilt"] += 1
        tally["corruptions"] += 1


def test_a_cached_model_graph_that_is_truncated_is_rebuilt_on_search(env, tally):
    assert env.search_all(env.pristine) == env.baseline  # exports this test's graphs into its own cache
    for d in (_cache() / "onnx").iterdir():
        for f in d.glob("model.onnx*"):
            _truncate(f)
    assert env.search_all(env.pristine) == env.baseline
    tally["rebuilt"] += 1
    tally["corruptions"] += 1


def test_every_corruption_of_a_kept_compiled_query_graph_is_compiled_again(env, tally, caplog):
    """The query graph kept compiled under ``$RETR_CACHE/compiled`` (an OpenVINO index's): each file of its entry
    truncated, a byte flipped, emptied or the blob swapped for another's: the search compiles the graph again and
    returns exactly what it returned before (a damaged blob is never imported)."""
    from retr.retrieval.backends.compiled import BLOB

    caplog.set_level("WARNING", logger="retr")
    idx = env.root / "openvino-index"
    shutil.rmtree(idx, ignore_errors=True)
    rc, _, err = _run(["index", "--corpus", str(env.corpus), "--out", str(idx), "--model", env.model,
                       "--backend", "openvino", "--bm25"])
    assert rc == 0, err

    def dense() -> list:
        rc, out, err = _run(["search", str(idx), SEARCH_QUERIES[0], "--mode", "dense", "--json", "-k", "5",
                             "--query-backend", "openvino"])
        assert rc == 0, err
        return [(r["id"], round(r["score"], 5)) for r in json.loads(out)["results"]]

    baseline = dense()  # compiled to be timed
    assert dense() == baseline  # compiled and kept
    root = _cache() / "compiled"
    entries = [d for d in root.iterdir() if d.is_dir() and (d / BLOB).is_file()]
    assert entries
    pristine = {f: f.read_bytes() for d in entries for f in d.iterdir()}

    def other_blob(p: Path) -> None:  # a well-formed blob of another compilation, its manifest left as it was
        data = bytearray(pristine[p])
        data[len(data) // 3] ^= 0x01
        p.write_bytes(bytes(data))

    for f in sorted(pristine):
        for corrupt in (_truncate, _flip, _empty) + ((other_blob,) if f.name == BLOB else ()):
            for g, data in pristine.items():  # the entry as kept, then this one file damaged
                g.parent.mkdir(exist_ok=True)
                g.write_bytes(data)
            corrupt(f)
            caplog.clear()
            got = dense()
            if got != baseline:
                tally["wrong_results"] += 1
            assert got == baseline, f"{corrupt.__name__} {f}: a wrong result"
            warned = any("damaged" in r.getMessage() for r in caplog.records)
            # the blob damaged in any way is caught; a manifest may lose a byte where nothing reads it
            assert warned or f.name != BLOB, (corrupt.__name__, f)
            tally["rebuilt" if warned else "unchanged"] += 1
            tally["corruptions"] += 1


# -- concurrent builds ------------------------------------------------------------------------------------------
def test_a_second_concurrent_build_into_one_out_is_refused(env, tally):
    from retr.retrieval.artifacts import writer_lock

    idx = env.fresh_copy("concurrent")
    before = env.search_all(idx)
    with writer_lock(idx):  # another writer holds the folder (a real flock: a second open file cannot take it)
        rc, _, err = env.build(env.corpus2, idx)
    assert rc == 2 and "another retr process is writing it" in _error_lines(err)[0]
    assert env.search_all(idx) == before
    tally["concurrent"] += 1


# -- bad inputs ------------------------------------------------------------------------------------------------
def _bad_inputs(env: Env, root: Path) -> list[tuple[str, list[str], str, list[Path]]]:
    """(label, argv, expected error regex, files that must survive untouched)."""
    user = root / "user-folder"
    user.mkdir()
    (user / "a").write_text("x")
    beir = write_beir(root / "beir")
    (root / "afile").write_text("keep me")
    bad = root / "bad"
    bad.mkdir()

    def f(name: str, text: str | bytes) -> Path:
        p = bad / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p

    def qrels_ds(name: str, qrels: str) -> Path:
        ds = write_beir(bad / name)
        (ds / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
        return ds

    idx = env.fresh_copy("for-bad-inputs")
    listm = env.fresh_copy("list-manifest")
    (listm / "manifest.json").write_text("[]")
    cases = [
        ("--out is a user's folder", env.index_argv(env.corpus, user), r"user-folder: exists and is not a retr index "
         r"folder", [user / "a"]),
        ("--out .", [*env.index_argv(env.corpus, Path("."))], r"holds the corpus being indexed|not a retr index",
         [env.corpus]),
        ("--out is a file", env.index_argv(env.corpus, root / "afile"), r"afile: exists and is not a folder",
         [root / "afile"]),
        ("--out is the BEIR folder", env.index_argv(beir, beir), r"holds the corpus being indexed",
         [beir / "corpus.jsonl", beir / "queries.jsonl"]),
        ("--out inside the BEIR folder", env.index_argv(beir, beir / "idx"), r"inside the dataset folder",
         [beir / "corpus.jsonl"]),
        ("wrong --text-field", [*env.index_argv(env.corpus, root / "o1"), "--text-field", "body"],
         r"documents would have no text: field 'body' is missing .* the records have '_id', 'title', 'text'", []),
        ("ambiguous id fields", env.index_argv(f("amb.jsonl", '{"_id": "1", "id": 2, "text": "a"}\n'), root / "o2"),
         r"amb\.jsonl: records have both '_id' and 'id'", []),
        ("text as a list", env.index_argv(f("list.jsonl", '{"_id": "1", "text": ["a"]}\n'), root / "o3"),
         r"list\.jsonl:1: field 'text' holds a JSON list", []),
        ("id as a boolean", env.index_argv(f("bool.jsonl", '{"_id": true, "text": "a"}\n'), root / "o4"),
         r"bool\.jsonl:1: id field '_id' holds a JSON bool", []),
        ("not UTF-8", env.index_argv(f("latin.jsonl", b'{"_id": "1", "text": "caf\xe9"}\n'), root / "o5"),
         r"latin\.jsonl:1: not valid UTF-8", []),
        ("malformed JSON", env.index_argv(f("broken.jsonl", '{"_id": "1", "text": "a\x01"}\n'), root / "o6"),
         r"broken\.jsonl:1: malformed JSON \(Invalid control character at column", []),
        ("qrels naming no document", ["eval", "--dataset", str(qrels_ds("nodocs", "q1\tNOPE\t1\n")),
                                      "--model", env.model, "--backend", "onnx"], r"nothing to score", []),
        ("grade 0.4", ["eval", "--dataset", str(qrels_ds("frac", "q1\td1\t0.4\n")), "--model", env.model],
         r"test\.tsv:2: relevance '0\.4' is not an integer grade", []),
        ("grade inf", ["eval", "--dataset", str(qrels_ds("inf", "q1\td1\tinf\n")), "--model", env.model],
         r"test\.tsv:2: relevance 'inf' is not an integer grade", []),
        ("--split ../../x", ["eval", "--dataset", str(beir), "--split", "../../x"], r"split '\.\./\.\./x'", []),
        ("empty query", ["search", str(idx), "", "--backend", "onnx"], r"the query is empty", []),
        ("whitespace query", ["search", str(idx), "   \t", "--mode", "bm25"], r"the query is empty", []),
        ("manifest holding a list", ["search", str(listm), "solar"], r"manifest.json: a manifest is a JSON object", []),
        ("no such index", ["search", str(root / "nope"), "solar"], r"no such index folder", []),
        ("a pipeline that does not exist", ["eval", "--dataset", str(beir), "--modes", "colbert"],
         r"pipeline 'colbert', position 1: unknown stage 'colbert'", []),
        ("rerank without a cross-encoder", ["eval", "--dataset", str(beir), "--modes", "dense+rerank"],
         r"rerank pipelines need a cross-encoder", []),
    ]
    return cases


def test_a_table_of_bad_inputs_each_gets_one_clean_line(env, tally, tmp_path, monkeypatch):
    monkeypatch.chdir(env.root)  # `--out .` points at the folder that holds the user's corpus
    for label, argv, pattern, keep in _bad_inputs(env, tmp_path):
        before = {p: p.read_bytes() for p in keep}
        rc, _, err = _run(argv)
        lines = _error_lines(err)
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("retr: error: "), (label, rc, err)
        import re

        assert re.search(pattern, lines[0]), (label, lines[0])
        for p, data in before.items():
            if not p.is_file() or p.read_bytes() != data:
                tally["data_lost"] += 1
            assert p.is_file() and p.read_bytes() == data, f"{label}: {p} was changed"
        tally["bad_inputs"] += 1
    assert not any(tmp_path.glob("o[0-9]*")), "a refused build left an output behind"
