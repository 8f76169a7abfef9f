"""Compiled query graphs kept for the next process (``retrieval.backends.compiled``): read back only checked, a
damaged one compiled again, kept only where reading it back was measured faster, superseded ones removed."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

from retr.retrieval.backends import compiled as compiled_mod
from retr.retrieval.backends.compiled import BLOB, CompiledStore


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # two streams to make one of, on any host


def _feed(enc, text="wolves in the forest"):
    ids = np.asarray(enc.tokens.ids([text]), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _entries(root):
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def _keep_every_blob(monkeypatch):
    """Reading back a tiny model may be no faster than compiling it: keep the blob whatever the timing says."""
    monkeypatch.setattr(compiled_mod, "_measured", lambda folder, meta, read_s: None)


def _compile_fails(monkeypatch):
    import openvino as ov

    def fail(*a, **k):
        raise AssertionError("compiled instead of read back")
    monkeypatch.setattr(ov.Core, "compile_model", fail)


def test_the_query_graph_is_kept_compiled_and_read_back_checked_by_the_next_process(tiny_bi_encoder, two_cores,
                                                                                    monkeypatch):
    """The graph queries take is kept compiled under ``$RETR_CACHE/compiled`` from its next compilation on, and the
    next process imports it from there (nothing compiled) with the same vectors. The documents' streams of an index
    build, and candidates only timed, are not kept."""
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.runners import COMPILED
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    _keep_every_blob(monkeypatch)
    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    enc = BiEncoder(cfg)
    root = cache_home() / COMPILED
    enc.encode(["documents through the streams"])
    assert _entries(root) == []  # the documents' streams: not kept
    assert enc.query_graphs.one_stream().runner._kept is None  # a candidate as such: not kept
    single = enc.query_graph
    first = single.runner(_feed(enc))
    # compiled already to be timed, kept from its next compilation on (here, where the documents' graph was
    # timed fastest: compiled again after its streams were dropped); never another candidate
    assert all(p.name.startswith(single.path.parent.name + "-") for p in _entries(root))
    second = BiEncoder(cfg).query_graph  # the next process: the stored choice, compiled and kept
    np.testing.assert_array_equal(second.runner(_feed(enc)), first)
    (entry,) = _entries(root)
    meta = json.loads((entry / "manifest.json").read_text())
    assert entry.name.startswith(single.path.parent.name + "-") and meta["files"][BLOB]["bytes"] > 0
    assert meta["source"] == str(single.path.parent.resolve()) and meta["compile_seconds"] > 0
    stamp = (entry / BLOB).stat().st_mtime_ns
    _compile_fails(monkeypatch)
    again = BiEncoder(cfg).query_graph  # and the one after it: read back, nothing compiled nor written
    np.testing.assert_array_equal(again.runner(_feed(enc)), first)
    assert _entries(root) == [entry] and (entry / BLOB).stat().st_mtime_ns == stamp


def _kept_entry(tiny_bi_encoder, monkeypatch):
    """A BiEncoder's query graph kept compiled (its entry), and that graph's vector of a text."""
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.runners import COMPILED
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    enc = BiEncoder(cfg)
    want = enc.query_graph.runner(_feed(enc))
    BiEncoder(cfg).query_graph.runner(_feed(enc))  # compiled and kept
    (entry,) = _entries(cache_home() / COMPILED)
    return cfg, enc, entry, want


@pytest.mark.parametrize("damage", ["flipped", "truncated", "garbage manifest", "a symlink", "a FIFO manifest",
                                    "another entry's files", "a symlinked entry"])
def test_a_damaged_kept_model_is_discarded_with_a_warning_and_compiled_again(tiny_bi_encoder, two_cores,
                                                                             monkeypatch, caplog, tmp_path, damage):
    """OpenVINO's own model cache ran a blob with flipped bytes and ranked with it. A kept model is checked in full
    before it is imported: a damaged one is discarded (a warning naming it), the graph compiled again (its right
    vectors) and kept anew."""
    from retr.retrieval.encoder import BiEncoder

    _keep_every_blob(monkeypatch)
    cfg, enc, entry, want = _kept_entry(tiny_bi_encoder, monkeypatch)
    blob = entry / BLOB
    if damage == "flipped":
        data = bytearray(blob.read_bytes())
        start = int(len(data) * 0.3)  # among the weights (the graph's description is at the end): still imports
        for i in range(start, start + 4000, 7):
            data[i] ^= 0x40
        blob.write_bytes(bytes(data))
    elif damage == "a symlink":  # to the same bytes elsewhere: never followed
        elsewhere = tmp_path / "elsewhere.blob"
        blob.rename(elsewhere)
        blob.symlink_to(elsewhere)
    elif damage == "a FIFO manifest":  # never blocks
        (entry / "manifest.json").unlink()
        os.mkfifo(entry / "manifest.json")
    elif damage in ("another entry's files", "a symlinked entry"):  # a consistent pair, of another CPU's entry
        import openvino as ov

        runner = BiEncoder(cfg).query_graph.runner
        other = CompiledStore(entry.parent, runner._kept.source, "another CPU")
        other.compile(ov.Core(), runner._model, runner.compile_config())
        (theirs,) = [p for p in entry.parent.iterdir() if p != entry and not p.name.startswith(".")]
        if damage == "a symlinked entry":
            shutil.rmtree(entry)
            entry.symlink_to(theirs)
        else:
            for name in ("manifest.json", BLOB):
                (entry / name).write_bytes((theirs / name).read_bytes())
    elif damage == "truncated":
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    else:
        (entry / "manifest.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="retr"):
        got = BiEncoder(cfg).query_graph.runner(_feed(enc))
    np.testing.assert_array_equal(got, want)
    assert any(("damaged" in r.getMessage() or "not a folder" in r.getMessage()) and str(entry) in r.getMessage()
               for r in caplog.records)
    meta = json.loads((entry / "manifest.json").read_text())  # kept again, checked
    assert meta["files"][BLOB]["bytes"] == blob.stat().st_size > 0 and not blob.is_symlink()
    assert not entry.is_symlink() and meta["cpu"] != "another CPU"


def test_a_kept_model_stays_only_where_reading_it_back_was_measured_faster_than_compiling(tiny_bi_encoder,
                                                                                         two_cores, monkeypatch):
    """After the first read back, an entry keeps its blob where reading, checking and importing it took less
    time than its compilation did; otherwise only the note that it did not pay stays, and the model is compiled
    from then on (nothing read, nothing written again)."""
    from retr.retrieval.encoder import BiEncoder

    cfg, enc, entry, want = _kept_entry(tiny_bi_encoder, monkeypatch)
    meta = json.loads((entry / "manifest.json").read_text())
    compile_s = meta["compile_seconds"]
    inode = (entry / BLOB).stat().st_ino
    compiled_mod._measured(entry, meta, compile_s / 2)  # faster: the same blob kept, the reading recorded
    kept = json.loads((entry / "manifest.json").read_text())
    assert kept["read_seconds"] == compile_s / 2 and (entry / BLOB).stat().st_ino == inode
    with monkeypatch.context() as m:
        _compile_fails(m)
        np.testing.assert_array_equal(BiEncoder(cfg).query_graph.runner(_feed(enc)), want)  # read back
    compiled_mod._measured(entry, meta, compile_s * 2)  # slower: the note alone
    note = json.loads((entry / "manifest.json").read_text())
    assert "files" not in note and "not_kept" in note and not (entry / BLOB).exists()
    monkeypatch.setattr(compiled_mod, "_map_at", lambda *a: pytest.fail("a note is all there is: nothing to read"))
    np.testing.assert_array_equal(BiEncoder(cfg).query_graph.runner(_feed(enc)), want)  # compiled
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json"]


def test_writing_a_kept_model_removes_those_it_supersedes_and_what_openvinos_cache_left(tiny_bi_encoder, two_cores,
                                                                                        monkeypatch, tmp_path):
    """An entry of the same graph folder made from an earlier export of it, or whose graph folder is gone, and the
    ``*.blob`` files OpenVINO's own cache wrote there (an earlier retr) are removed when an entry is written; an
    entry of another graph still in the cache, and anything not an entry, stay."""
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.runners import COMPILED
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    _keep_every_blob(monkeypatch)
    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    enc = BiEncoder(cfg)
    source = enc.query_graph.path.parent
    root = cache_home() / COMPILED
    root.mkdir(parents=True)

    def entry(name, **fields):
        meta = {"format": compiled_mod.KIND, "source": str(source), "source_manifest_sha256": "0" * 64,
                "openvino": "2099.1", "cpu": "another CPU", **fields}
        (root / name).mkdir()
        (root / name / "manifest.json").write_text(json.dumps(meta))
        return root / name

    earlier_export = entry(source.name + "-0123456789abcdef")
    gone = entry("elsewhere-0123456789abcdef", source=str(tmp_path / "no such graph"))
    other = tmp_path / "another graph"
    other.mkdir()
    another = entry("another-0123456789abcdef", source=str(other))
    # a graph folder whose name begins with this one's (openvino / openvino-int8w): its entry is not this one's
    longer = tmp_path / (source.name + "-int8w")
    longer.mkdir()
    prefixed = entry(source.name + "-int8w-0123456789abcdef", source=str(longer))
    (root / "2719112451699636675.blob").write_bytes(b"OpenVINO's")
    (root / "notes.txt").write_text("not ours")
    runner = BiEncoder(cfg).query_graph.runner
    store = runner._kept
    # the very entry about to be written, under another name (an earlier retr named entries otherwise)
    renamed = entry(source.name + "-fedcba9876543210",
                    **store._identity(store._source_digest(), runner.compile_config()))
    runner(_feed(enc))  # compiled and kept
    names = {p.name for p in _entries(root)}
    assert earlier_export.name not in names and gone.name not in names and "2719112451699636675.blob" not in names
    assert renamed.name not in names
    assert {another.name, prefixed.name, "notes.txt"} <= names and len(names) == 4


def test_a_cache_that_cannot_be_written_still_compiles_and_searches(tiny_bi_encoder, two_cores, monkeypatch):
    """Where the cache's ``compiled`` folder cannot be made (here a file stands in its place), the query graph is
    compiled every time, with the same vectors, and nothing fails."""
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.runners import COMPILED
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    enc = BiEncoder(cfg)
    want = enc.query_graph.runner(_feed(enc))
    # kept there or not, depending on which candidate the timing picked (compiled before or after it was chosen)
    shutil.rmtree(cache_home() / COMPILED, ignore_errors=True)
    (cache_home() / COMPILED).write_text("in the way")
    np.testing.assert_array_equal(BiEncoder(cfg).query_graph.runner(_feed(enc)), want)
    assert (cache_home() / COMPILED).read_text() == "in the way"


def test_an_entry_names_its_graph_as_its_manifest_reads_and_what_it_was_compiled_with(tmp_path):
    """Another export of the graph (its manifest rewritten), other compile options or another CPU: another
    entry; the same: the same entry."""
    src = tmp_path / "model-openvino"
    src.mkdir()
    (src / "manifest.json").write_text('{"files": {"model.bin": {"sha256": "a"}}}')
    store = CompiledStore(tmp_path / "compiled", src, "AMD EPYC")
    digest = store._source_digest()
    a = store.folder(digest, {"NUM_STREAMS": 1})
    assert a == CompiledStore(tmp_path / "compiled", src, "AMD EPYC").folder(digest, {"NUM_STREAMS": 1})
    assert a.name.startswith("model-openvino-")
    assert a != store.folder(digest, {"NUM_STREAMS": 2})
    assert a != CompiledStore(tmp_path / "compiled", src, "Intel Xeon").folder(digest, {"NUM_STREAMS": 1})
    (src / "manifest.json").write_text('{"files": {"model.bin": {"sha256": "b"}}}')
    assert a != store.folder(store._source_digest(), {"NUM_STREAMS": 1})
