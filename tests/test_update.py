"""Indexes that change: `retr add` / `retr delete` / `retr compact` give exactly what a fresh build of the same
documents gives, for every index kind and mode; each change is a new generation; bad input is refused."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.indexes.folder import IndexFolder
from retr.indexes.searcher import Searcher
from retr.retrieval.encoder import EncoderConfig

from .conftest import DOCS, QUERIES

KINDS = ["flat", "hnsw", "ivfpq", "lean"]
MODES = ["bm25", "dense", "hybrid"]
BASE = DOCS[:12]
UPDATED = ("d3", "Hydro power", "Reservoirs behind dams release water through turbines to make electricity at night.")
ADDED = [DOCS[12], DOCS[13], UPDATED, DOCS[14], DOCS[15]]
DELETED = ["d5", "d9"]


def _write(path, docs):
    path.write_text("".join(json.dumps({"_id": d, "title": t, "text": x, "n": i % 2}) + "\n"
                            for i, (d, t, x) in enumerate(docs)))
    return path


def _final_docs():
    """The live documents after the changes, in row order: the kept base documents, then the added ones."""
    gone = set(DELETED) | {UPDATED[0]}
    return [d for d in BASE if d[0] not in gone] + ADDED


def _index(root, name, corpus, model, kind):
    folder = root / name
    assert main(["index", "--corpus", str(corpus), "--out", str(folder), "--model", str(model), "--backend", "onnx",
                 "--kind", kind]) == 0
    return folder


def _results(folder):
    queries = tuple(QUERIES.values())
    s = Searcher(folder, EncoderConfig(backend="onnx"))
    try:
        n = len(s.index.ids)
        return {(mode, q): [(h.id, h.score, h.title, h.text) for h in s.search(q, k=n, mode=mode).hits]
                for mode in MODES for q in queries}
    finally:
        s.close()


@pytest.fixture(scope="module", params=KINDS)
def changed(request, tiny_bi_encoder, tmp_path_factory):
    kind = request.param
    root = tmp_path_factory.mktemp(f"update-{kind}")
    folder = _index(root, "changed", _write(root / "base.jsonl", BASE), tiny_bi_encoder, kind)
    assert main(["add", str(folder), "--corpus", str(_write(root / "new.jsonl", ADDED))]) == 0
    (root / "gone.txt").write_text("\n".join(DELETED) + "\n")
    assert main(["delete", str(folder), "--ids", str(root / "gone.txt")]) == 0
    fresh = _index(root, "fresh", _write(root / "final.jsonl", _final_docs()), tiny_bi_encoder, kind)
    return kind, folder, fresh


def test_search_after_add_and_delete_equals_a_fresh_build(changed):
    kind, folder, fresh = changed
    got, want = _results(folder), _results(fresh)
    assert got.keys() == want.keys()
    for key in want:
        assert [h[0] for h in got[key]] == [h[0] for h in want[key]], (kind, key)
        assert [h[2:] for h in got[key]] == [h[2:] for h in want[key]], (kind, key)
        assert [h[1] for h in got[key]] == pytest.approx([h[1] for h in want[key]], abs=1e-5), (kind, key)
    ids = {h[0] for hits in got.values() for h in hits}
    assert not ids & set(DELETED), "a deleted document came back"
    updated = [h for h in got[("bm25", QUERIES["q1"])] if h[0] == "d3"]
    assert not updated or updated[0][3] == UPDATED[2], "an updated document kept its old text"


def test_generations_tombstones_and_compact(changed):
    kind, folder, fresh = changed
    before = _results(folder)
    idx = IndexFolder(folder)
    m = idx.manifest
    assert m["generation"] == 2 and [c["op"] for c in m["changes"]] == ["add", "delete"]
    assert m["num_docs"] == len(_final_docs()) and m["tombstones"] == 3  # d3's old record, d5, d9
    assert m["stored_docs"] == len(BASE) + len(ADDED)
    assert m["changes"][0]["updated"] == 1 and m["changes"][0]["added"] == 4
    idx.close()
    assert main(["compact", str(folder)]) == 0
    idx = IndexFolder(folder)
    assert idx.manifest["tombstones"] == 0 and idx.manifest["stored_docs"] == idx.manifest["num_docs"]
    assert idx.rows is None and idx.ids == [d[0] for d in _final_docs()]
    assert (idx.parts / "docstore.jsonl").stat().st_size < sum(len(json.dumps(d)) for d in DOCS) * 2
    idx.close()
    assert _results(folder) == before
    assert main(["compact", str(folder)]) == 0  # nothing left to fold: a no-op


def test_filters_see_the_changed_documents(changed):
    _, folder, _ = changed
    s = Searcher(folder, EncoderConfig(backend="onnx"))
    try:
        for mode in MODES:
            hits = s.search("water electricity turbines", k=20, mode=mode, filter={"n": 1}).hits
            final = {d[0]: i % 2 for i, d in enumerate(ADDED)}
            final.update({d[0]: i % 2 for i, d in enumerate(BASE) if d[0] not in final})
            assert hits and all(final[h.id] == 1 for h in hits), mode
            assert not {h.id for h in hits} & set(DELETED)
    finally:
        s.close()


def test_bad_changes_are_refused_and_leave_the_index_as_it_was(tiny_bi_encoder, tmp_path, capsys):
    folder = _index(tmp_path, "idx", _write(tmp_path / "base.jsonl", BASE), tiny_bi_encoder, "flat")
    manifest = (folder / "manifest.json").read_text()
    capsys.readouterr()
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n\nnope\n")
    assert main(["delete", str(folder), "--ids", str(ids)]) == 2
    err = capsys.readouterr().err
    assert f"{ids}:3: no live document 'nope'" in err and err.count("\n") == 1
    assert (folder / "manifest.json").read_text() == manifest
    assert main(["-q", "delete", str(folder), "--ids", str(ids), "--missing-ok"]) == 0
    assert "d1" not in IndexFolder(folder).ids
    deleted = (folder / "manifest.json").read_text()
    capsys.readouterr()
    assert main(["delete", str(folder), "--ids", str(ids), "--missing-ok"]) == 0  # run again: nothing left to do
    assert "deleted 0 from" in capsys.readouterr().out and (folder / "manifest.json").read_text() == deleted
    everything = tmp_path / "all.txt"
    everything.write_text("\n".join(d[0] for d in BASE[1:]))
    assert main(["delete", str(folder), "--ids", str(everything)]) == 2
    assert "would leave the index empty" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "x1", "text": "fine"}\n{"_id": "x2", "text": \n')
    assert main(["add", str(folder), "--corpus", str(bad)]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert len(IndexFolder(folder).ids) == len(BASE) - 1


def test_the_api_changes_an_open_index(tiny_bi_encoder, tmp_path):
    import retr

    base = _write(tmp_path / "base.jsonl", BASE)
    with retr.Index.build(base, tmp_path / "idx", model=str(tiny_bi_encoder), backend="onnx") as index:
        change = index.add(_write(tmp_path / "new.jsonl", ADDED))
        assert (change.added, change.updated) == (4, 1)
        assert "d16" in index.ids
        assert index.search("tundra caribou", k=3, mode="bm25").hits[0].id == "d16"
        index.delete(["d16"])
        assert "d16" not in {h.id for h in index.search("tundra caribou", k=20, mode="hybrid").hits}
        assert index.compact().tombstones == 0
        with pytest.raises(retr.RetrError, match="no live document 'd16'"):
            index.delete(["d16"])
