"""Readers on a commit point: an opened index reads every part from the generation it opened, whatever writers
do meanwhile; publishing is one atomic step, and a crash at any step of it leaves the old or the new index (issue
41, cases 2, 3 and 14)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest

from retr.cli.main import main
from retr.indexes.folder import IndexFolder
from retr.indexes.searcher import Searcher
from retr.indexes.shards import open_index
from retr.indexes.update import add_documents, delete_documents
from retr.retrieval.encoder import EncoderConfig

from .conftest import DOCS

BASE = DOCS[:12]
OTHER = [(d, t, f"{x} Replaced by the second build.") for d, t, x in DOCS[:6]]


def _write(path, docs):
    path.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs))
    return path


def _build(corpus, out, model, *extra) -> None:
    assert main(["-q", "index", "--corpus", str(corpus), "--out", str(out), "--model", str(model), "--backend", "onnx",
                 *extra]) == 0


def _top(searcher: Searcher, text: str) -> tuple[str, str]:
    hit = searcher.search(text, k=1, mode="bm25").hits[0]
    return hit.id, hit.text


def test_an_open_reader_keeps_its_generation_while_another_writer_changes_the_folder(tiny_bi_encoder, tmp_path):
    """Case 3: parts loaded lazily (BM25, FAISS, doc store) come from the generation opened, not from disk now."""
    idx = tmp_path / "idx"
    _build(_write(tmp_path / "c.jsonl", BASE), idx, tiny_bi_encoder)
    reader = Searcher(idx, EncoderConfig(backend="onnx"))  # ids read; BM25, FAISS and the doc store not yet
    try:
        delete_documents(idx, ["d5"])  # another writer: every later row shifts by one
        add_documents(idx, _corpus(tmp_path, [("d5b", "Tea again", "Green tea leaves steeped for a short time.")]))
        ten = BASE[9]
        assert _top(reader, ten[2]) == (ten[0], ten[2]), "a reader answered from another generation's rows"
        assert reader.search(ten[2], k=1, mode="dense").hits[0].id in reader.index.ids
        assert "d5" in reader.index.ids and reader.document("d5").text == BASE[4][2]
        fresh = Searcher(idx, EncoderConfig(backend="onnx"))
        try:
            assert "d5" not in fresh.index.ids and _top(fresh, ten[2]) == (ten[0], ten[2])
            assert fresh.index.generation == reader.index.generation + 2
        finally:
            fresh.close()
    finally:
        reader.close()


def _corpus(tmp_path, docs):
    from retr.indexes.corpus import load_corpus

    return load_corpus(_write(tmp_path / f"add-{docs[0][0]}.jsonl", docs))


def test_the_opened_generation_is_exposed_and_is_the_manifests(tiny_bi_encoder, tmp_path):
    """Case 14: ``index.generation`` is the generation the manifest names (what /healthz must report)."""
    idx = tmp_path / "idx"
    _build(_write(tmp_path / "c.jsonl", BASE), idx, tiny_bi_encoder)
    first = Searcher(idx, EncoderConfig(backend="onnx"))
    assert first.index.generation == 0
    first.close()
    delete_documents(idx, ["d1"])
    delete_documents(idx, ["d2"])
    opened = IndexFolder(idx)
    try:
        assert opened.generation == 2 == json.loads((idx / "manifest.json").read_text())["generation"]
    finally:
        opened.close()


def test_a_rebuild_over_an_open_index_never_pulls_parts_from_under_its_reader(tiny_bi_encoder, tmp_path):
    idx = tmp_path / "idx"
    _build(_write(tmp_path / "c.jsonl", BASE), idx, tiny_bi_encoder)
    reader = Searcher(idx, EncoderConfig(backend="onnx"))
    try:
        _build(_write(tmp_path / "other.jsonl", OTHER), idx, tiny_bi_encoder)  # a rebuild: `retr index --out idx`
        assert _top(reader, BASE[9][2]) == (BASE[9][0], BASE[9][2])
        assert len(reader.index.ids) == len(BASE)
        new = reader.reopened()  # Searcher.reopened keeps its meaning: the folder's current generation
        try:
            assert len(new.index.ids) == len(OTHER) and new.index.generation == 1
            assert _top(new, OTHER[2][2])[1] == OTHER[2][2]
        finally:
            new.close()
    finally:
        reader.close()
    _build(_write(tmp_path / "c2.jsonl", BASE), idx, tiny_bi_encoder)  # no reader holds the older ones now
    assert sorted(p.name for p in idx.iterdir() if not p.name.startswith(".")) == ["gen-000002", "manifest.json"]


def test_a_sharded_index_and_its_rebuild_keep_working(tiny_bi_encoder, tmp_path):
    idx = tmp_path / "idx"
    _build(_write(tmp_path / "c.jsonl", BASE), idx, tiny_bi_encoder, "--shards", "2")
    first = open_index(idx)
    _build(_write(tmp_path / "c2.jsonl", OTHER), idx, tiny_bi_encoder, "--shards", "2")
    try:
        assert sorted(first.ids) == sorted(d for d, _, _ in BASE)
        assert first.docstore.get(0).doc_id == first.ids[0]
        second = open_index(idx)
        assert sorted(second.ids) == sorted(d for d, _, _ in OTHER) and second.generation == 1
        second.close()
    finally:
        first.close()


# -- a crash at each step of publishing (simulated: the file system frozen at that step) -------------------------
class Crash(BaseException):
    """The writer dies here: nothing it would do afterwards (renames, removals, its own clean-up) happens."""


@contextlib.contextmanager
def crash_at(monkeypatch, idx, step: int):
    """Freeze the file system at the ``step``-th rename touching ``idx`` (or a sibling named after it)."""
    seen = {"n": 0, "dead": False}
    real = {"rename": os.rename, "replace": os.replace}

    def touches(*paths) -> bool:
        return any(str(p).startswith(str(idx)) or os.path.basename(str(p)).startswith(f".{idx.name}")
                   for p in paths)

    def renamer(name):
        def go(src, dst, *a, **k):
            if seen["dead"]:
                raise Crash()
            if touches(src, dst):
                seen["n"] += 1
                if seen["n"] == step:
                    seen["dead"] = True
                    raise Crash()
            return real[name](src, dst, *a, **k)
        return go

    def frozen(real_fn):
        def go(*a, **k):
            if seen["dead"]:
                return None
            return real_fn(*a, **k)
        return go

    with monkeypatch.context() as m:
        m.setattr(os, "rename", renamer("rename"))
        m.setattr(os, "replace", renamer("replace"))
        m.setattr(shutil, "rmtree", frozen(shutil.rmtree))
        m.setattr(os, "unlink", frozen(os.unlink))
        m.setattr(os, "rmdir", frozen(os.rmdir))
        yield seen


def _complete_copies(idx) -> set[str]:
    """Every complete index (a folder holding a manifest) at or beside ``idx``, by the ids it holds."""
    out = set()
    for folder in [idx, *idx.parent.glob(f".{idx.name}*"), *idx.glob("gen-*"), *idx.glob(".gen-*")]:
        m = folder / "manifest.json"
        if m.is_file() and (folder / "ids.json").is_file():
            out.add(",".join(sorted(json.loads((folder / "ids.json").read_text()))))
    return out


@pytest.mark.parametrize("writer", ["rebuild", "delete"])
def test_a_crash_at_each_publishing_step_leaves_the_old_or_the_new_index(tiny_bi_encoder, tmp_path, monkeypatch,
                                                                         writer):
    """Case 2: killed between the renames of a swap, today's writer left no index, and the next build deleted both
    complete copies. Now: the old or the new generation always opens, and the next writer deletes no complete
    copy but a superseded one."""
    base, other = _write(tmp_path / "c.jsonl", BASE), _write(tmp_path / "other.jsonl", OTHER)
    old_ids, new_ids = sorted(d for d, _, _ in BASE), sorted(d for d, _, _ in (OTHER if writer == "rebuild"
                                                                                  else BASE[1:]))
    step = 0
    while True:
        step += 1
        idx = tmp_path / f"idx-{writer}-{step}"
        _build(base, idx, tiny_bi_encoder)
        with crash_at(monkeypatch, idx, step) as seen:
            try:
                if writer == "rebuild":
                    main(["-q", "index", "--corpus", str(other), "--out", str(idx), "--model", str(tiny_bi_encoder),
                          "--backend", "onnx"])
                else:
                    delete_documents(idx, ["d1"])
            except Crash:
                pass
        if not seen["dead"]:
            break  # the writer ran to its end: every step was crashed at
        copies = _complete_copies(idx)
        opened = open_index(idx)  # never fails: the old generation, or the newer complete one
        try:
            got = sorted(opened.ids)
            assert got in (old_ids, new_ids), f"step {step}: neither the old nor the new index"
            if ",".join(new_ids) in copies:
                assert got == new_ids, f"step {step}: a complete newer generation was not recovered"
        finally:
            opened.close()
        assert main(["-q", "delete", str(idx), "--ids", str(_ids_file(tmp_path, got[-1]))]) == 0  # the next writer
        opened = open_index(idx)
        try:  # the next writer worked on the generation that opened: nothing of it was lost
            assert sorted(opened.ids) == [i for i in got if i != got[-1]], f"step {step}: the next writer lost data"
        finally:
            opened.close()
    assert step >= 3, "publishing has at least two renames to crash at"


def _ids_file(tmp_path, doc_id):
    p = tmp_path / f"del-{doc_id}.txt"
    p.write_text(doc_id + "\n")
    return p


def test_a_folder_lost_between_the_two_renames_of_an_older_swap_is_recovered(tiny_bi_encoder, tmp_path):
    """An index left by the older retr's crash (``.idx.old-PID`` and a finished ``.idx.PID.x.building``, no
    ``idx``) opens as the newer copy, and a build never deletes either."""
    idx = tmp_path / "idx"
    _build(_write(tmp_path / "c.jsonl", BASE), idx, tiny_bi_encoder)
    new = tmp_path / "new"
    _build(_write(tmp_path / "other.jsonl", OTHER), new, tiny_bi_encoder)
    os.rename(idx, tmp_path / ".idx.old-999999")
    os.rename(new, tmp_path / ".idx.999999.abc.building")
    opened = open_index(idx)
    try:
        assert sorted(opened.ids) == sorted(d for d, _, _ in OTHER)
    finally:
        opened.close()
    assert (tmp_path / ".idx.old-999999" / "manifest.json").is_file(), "a complete copy was deleted on open"


def test_an_index_folder_reached_through_a_symlink_opens_and_changes(tiny_bi_encoder, tmp_path):
    real = tmp_path / "real"
    _build(_write(tmp_path / "c.jsonl", BASE), real, tiny_bi_encoder)
    link = tmp_path / "link"
    os.symlink(real, link)
    reader = open_index(link)
    try:
        delete_documents(link, ["d1"])
        assert "d1" in reader.ids and reader.docstore.get(0).doc_id == "d1"
    finally:
        reader.close()
    delete_documents(link, ["d2"])  # no reader holds generation 0 now: the root's parts are removed
    assert not (real / "ids.json").exists()
    opened = open_index(link)
    try:
        assert sorted(opened.ids) == sorted(d for d, _, _ in BASE[2:])
    finally:
        opened.close()


def test_a_rebuild_may_change_between_one_folder_and_shards(tiny_bi_encoder, tmp_path):
    idx = tmp_path / "idx"
    corpus = _write(tmp_path / "c.jsonl", BASE)
    _build(corpus, idx, tiny_bi_encoder, "--shards", "2")
    sharded = open_index(idx)
    _build(corpus, idx, tiny_bi_encoder)  # one folder now, while the sharded generation is still open
    try:
        assert len(sharded.shards) == 2 and sharded.docstore.get(3).doc_id == sharded.ids[3]
    finally:
        sharded.close()
    single = open_index(idx)
    try:
        assert not hasattr(single, "shards") and sorted(single.ids) == sorted(d for d, _, _ in BASE)
        assert single.generation == 1
    finally:
        single.close()
    _build(corpus, idx, tiny_bi_encoder, "--shards", "3")
    again = open_index(idx)
    try:
        assert len(again.shards) == 3 and again.generation == 2
    finally:
        again.close()
    assert sorted(p.name for p in idx.iterdir() if not p.name.startswith(".")) == ["gen-000002", "manifest.json"]
