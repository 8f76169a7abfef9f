"""Trust, third round: one writer per folder whatever path names it, readers that survive a part cut short under
them, every input a clean one-line error (the API's too), bounded settings, and stored choices checked on read.

Each test fails on 11c4983 (the commit before these fixes); the docstrings say how."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from retr.cli.main import main
from retr.retrieval.errors import RetrError

from .conftest import DOCS


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[retr]")]


def _corpus(path: Path, docs=DOCS) -> Path:
    path.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs))
    return path


@pytest.fixture(scope="module")
def built(tiny_bi_encoder, tmp_path_factory) -> Path:
    """A small hybrid index (flat dense + BM25), built once; tests copy it."""
    root = tmp_path_factory.mktemp("trust3")
    out = root / "pristine.idx"
    rc, _, err = _run(["index", "--corpus", str(_corpus(root / "c.jsonl")), "--out", str(out), "--model",
                       str(tiny_bi_encoder), "--backend", "onnx", "--bm25"])
    assert rc == 0, err
    return out


def _copy(built: Path, dst: Path) -> Path:
    shutil.copytree(built, dst)
    return dst


# -- 1. one writer per folder, found by the folder's identity --------------------------------------------------
def _refused_while_held(held: Path, other: Path) -> str:
    """The error a writer of ``other`` gets while another writer holds ``held`` (a real flock: another open file)."""
    from retr.retrieval.artifacts import writer_lock

    with writer_lock(held, op="add"), pytest.raises(RetrError) as e, writer_lock(other, op="add"):
        pass
    return str(e.value)


def test_a_symlinked_path_to_an_index_shares_its_writer_lock(built, tmp_path):
    """On 11c4983 the lock was ``.NAME.lock`` beside the path as given: ``current.idx`` (a symlink to ``g.idx``)
    had its own, two `retr add` built from one generation and one batch was lost."""
    g = _copy(built, tmp_path / "g.idx")
    link = tmp_path / "current.idx"
    link.symlink_to(g)
    assert "another retr process is writing it" in _refused_while_held(g, link)
    assert "another retr process is writing it" in _refused_while_held(link, g)
    rel = tmp_path / "rel.idx"  # a relative symlink, through a folder link too
    rel.symlink_to("g.idx")
    (tmp_path / "via").symlink_to(tmp_path)
    assert "another retr process is writing it" in _refused_while_held(rel, tmp_path / "via" / "g.idx")


def test_a_dotdot_spelled_path_shares_the_writer_lock(built, tmp_path):
    """``g.idx/bm25/..`` is ``g.idx``: on 11c4983 its lock was ``g.idx/bm25/....lock``, not ``.g.idx.lock``. Also
    ``data/b/../../data/g.idx`` where ``b`` is a symlink (its ``..`` is the link target's parent)."""
    real = tmp_path / "data"
    real.mkdir()
    g = _copy(built, real / "g.idx")
    up = Path(str(g / "bm25" / ".."))
    assert os.path.samefile(up, g)
    assert "another retr process is writing it" in _refused_while_held(g, up)
    assert "another retr process is writing it" in _refused_while_held(up, g)
    (tmp_path / "deep" / "x").mkdir(parents=True)
    (real / "b").symlink_to(tmp_path / "deep" / "x")
    spelled = Path(str(real / "b" / ".." / ".." / "data" / "g.idx"))  # b/.. is deep/, not data/
    assert os.path.samefile(spelled, g)
    assert "another retr process is writing it" in _refused_while_held(g, spelled)
    plain = Path(str(real / "g.idx" / ".." / "g.idx"))
    assert "another retr process is writing it" in _refused_while_held(plain, g)


def test_a_bind_mounted_index_folder_shares_the_writer_lock(built, tmp_path):
    """The same folder mounted a second time: no path of one names the other; on 11c4983 each had its lock."""
    g = _copy(built, tmp_path / "g.idx")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "--bind", str(g), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"this machine allows no bind mount: {r.stderr.strip()[:120]}")
    try:
        assert "another retr process is writing it" in _refused_while_held(g, mnt)
        assert "another retr process is writing it" in _refused_while_held(mnt, g)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_retr_add_through_a_symlink_is_refused_while_a_writer_holds_the_folder(built, tmp_path):
    """End to end: `retr add current.idx` while a writer holds ``g.idx`` is refused in one line, nothing lost;
    after it, both adds land (on 11c4983 the second ran beside the first and one batch was lost)."""
    from retr.indexes.folder import IndexFolder
    from retr.retrieval.artifacts import writer_lock

    g = _copy(built, tmp_path / "g.idx")
    link = tmp_path / "current.idx"
    link.symlink_to(g)
    a = _corpus(tmp_path / "a.jsonl", [("a1", "", "alpha one"), ("a2", "", "alpha two")])
    b = _corpus(tmp_path / "b.jsonl", [("b1", "", "beta one")])
    with writer_lock(g, op="add"):
        rc, _, err = _run(["add", str(link), "--corpus", str(b)])
    assert rc == 2 and len(_errors(err)) == 1 and "another retr process is writing it" in err, err
    assert _run(["add", str(g), "--corpus", str(a)])[0] == 0
    assert _run(["add", str(link), "--corpus", str(b)])[0] == 0
    index = IndexFolder(g)
    try:
        assert len(index.ids) == len(DOCS) + 3 and {"a1", "a2", "b1"} <= set(index.ids)
    finally:
        index.close()
    assert not [p for p in g.iterdir() if p.name.endswith(".lock")], "the lock inside is removed afterwards"


# -- 5. every corpus record indexed or refused in one line, never a traceback ------------------------------------
def test_a_lone_surrogate_in_a_corpus_is_one_line_naming_file_and_line(tiny_bi_encoder, tmp_path):
    """``"\\ud800"`` is valid JSON (a JS string cut mid-pair); on 11c4983 `retr index` died in ``corpus._digest``
    with ``UnicodeEncodeError`` and ``Index.from_documents`` raised it instead of a ``RetrError``."""
    import retr

    bad = tmp_path / "c.jsonl"
    bad.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "title": "x", "text": "cut \\ud800 here"}\n')
    rc, _, err = _run(["index", "--corpus", str(bad), "--out", str(tmp_path / "i"), "--model", str(tiny_bi_encoder),
                       "--backend", "onnx"])
    assert rc == 2 and _errors(err) == [f"retr: error: {bad}:2: the text holds '\\ud800', a lone surrogate (half of a "
                                        f"UTF-16 pair, cut from its other half): not text; fix the record"], err
    assert not (tmp_path / "i").exists()
    bad.write_text('{"_id": "a\\udc00", "text": "fine"}\n')
    rc, _, err = _run(["index", "--corpus", str(bad), "--out", str(tmp_path / "i"), "--model", str(tiny_bi_encoder),
                       "--backend", "onnx"])
    assert rc == 2 and len(_errors(err)) == 1 and f"{bad}:1: the id holds" in err, err
    with pytest.raises(RetrError, match=r"<documents>: document 2: the text holds '\\ud800'"):
        retr.Index.from_documents(["fine", "cut \ud800"], model=str(tiny_bi_encoder), backend="onnx")
    with pytest.raises(RetrError, match=r"document 1: the metadata holds"):
        retr.Index.from_documents([{"id": "a", "text": "t", "tag": "\udfff"}], model=str(tiny_bi_encoder),
                                  backend="onnx")


NASTY = ["\ud800", "\udfff", "\udbff\udc00", "\udc00\ud800", "\x00", "\x01", "\x1f", "\x7f", "\x85", "\u2028",
         "\ufeff", "\ufffe", "\uffff", "\n", "\r", "\t", '"', "\\", " ", "é", "😀"]


def _texts():
    from hypothesis import strategies as st

    return st.lists(st.one_of(st.characters(), st.sampled_from(NASTY)), max_size=10).map("".join)


def _records():
    from hypothesis import strategies as st

    return st.fixed_dictionaries({"_id": _texts(), "text": _texts()}, optional={"title": _texts(), "tag": _texts()})


def test_the_corpus_reader_indexes_or_refuses_any_json_strings_in_one_line(tiny_bi_encoder):
    """Hypothesis writes JSONL of arbitrary strings (lone surrogates as ``\\ud800`` escapes, control characters)
    and sometimes invalid UTF-8 bytes into a line: every file is read into documents that the index's text steps
    take (doc store written and read back, BM25 tokens, the model's tokenizer), or refused in one line naming the
    file (and line). On 11c4983 a lone surrogate escaped as ``UnicodeEncodeError``."""
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from tokenizers import Tokenizer

    from retr.indexes.bm25 import RowTokens
    from retr.indexes.corpus import load_corpus
    from retr.indexes.docstore import DocStore, write_docstore
    from retr.retrieval.bm25 import BM25Config

    tokenizer = Tokenizer.from_file(str(Path(tiny_bi_encoder) / "tokenizer.json"))
    seen = {"indexed": 0, "refused": 0}

    @settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(recs=st.lists(_records(), min_size=1, max_size=4), junk=st.one_of(st.none(), st.binary(min_size=1,
           max_size=3)), where=st.integers(0, 1000))
    def check(recs, junk, where):
        lines = [json.dumps(r).encode() for r in recs]  # ensure_ascii: a surrogate is written as its \\u escape
        if junk is not None:
            i = where % len(lines)
            cut = where % (len(lines[i]) + 1)
            lines[i] = lines[i][:cut] + junk + lines[i][cut:]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "corpus.jsonl"
            path.write_bytes(b"\n".join(lines) + b"\n")
            try:
                corpus = load_corpus(path)
            except RetrError as e:
                assert str(e).startswith(f"{path}:") and "\n" not in str(e), str(e)
                seen["refused"] += 1
                return
            write_docstore(Path(tmp), corpus.docs)
            with DocStore(Path(tmp), corpus.ids) as store:
                assert [store.get(i) for i in range(len(store))] == corpus.docs
            RowTokens.of([d.full_text() for d in corpus.docs], BM25Config())
            tokenizer.encode_batch([d.full_text() for d in corpus.docs])
            seen["indexed"] += 1

    check()
    assert seen["indexed"] and seen["refused"], seen  # both roads taken


# -- 2. a cross-encoder is refused as --model, as a bi-encoder is as --rerank ----------------------------------
def test_a_cross_encoder_folder_is_refused_as_model_at_every_door(tiny_cross_encoder, tiny_bi_encoder, tmp_path):
    """On 11c4983 ``retr index --model CE_DIR`` mean-pooled a ``*ForSequenceClassification`` folder into an index
    with exit 0, and ``retr doctor --model CE_DIR`` checked it as a bi-encoder."""
    import retr

    corpus = _corpus(tmp_path / "c.jsonl")
    ce = str(tiny_cross_encoder)
    st_ce = tmp_path / "st-ce"  # sentence-transformers' own CrossEncoder folder says so in its config
    shutil.copytree(tiny_bi_encoder, st_ce)
    (st_ce / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
    listed = tmp_path / "listed-ce"  # a classifier folder given a modules.json that names no pooling module
    shutil.copytree(tiny_cross_encoder, listed)
    (listed / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                        "type": "sentence_transformers.models.Transformer"}]))
    for model in (ce, str(st_ce), str(listed)):
        for argv in (["index", "--corpus", str(corpus), "--out", str(tmp_path / "i"), "--model", model,
                      "--backend", "onnx"],
                     ["doctor", "--model", model]):
            rc, _, err = _run(argv)
            assert rc == 2 and len(_errors(err)) == 1 and "a cross-encoder" in err and "--rerank" in err, (argv, err)
        assert not (tmp_path / "i").exists()
        with pytest.raises(RetrError, match="not a bi-encoder"):
            retr.Index.from_documents(["one", "two"], model=model, backend="onnx")
    # the bi-encoder itself and a plain base model (no head) are still taken
    assert _run(["index", "--corpus", str(corpus), "--out", str(tmp_path / "ok"), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx"])[0] == 0


# -- 3. every float setting bounded to a finite, documented range -----------------------------------------------
@pytest.mark.parametrize("argv, field", [
    (["--bm25-k1", "1e308"], "BM25 k1 must be in [0, 100]"),
    (["--bm25-k1", "1e30"], "BM25 k1 must be in [0, 100]"),
    (["--bm25-k1", "inf"], "BM25 k1 must be a finite number in [0, 100]"),
    (["--bm25-k1", "nan"], "BM25 k1 must be a finite number in [0, 100]"),
    (["--bm25-b", "nan"], "BM25 b must be a finite number in [0, 1]"),
    (["--bm25-method", "bm25+", "--bm25-delta", "1e300"], "BM25 delta must be in [0, 10]"),
])
def test_bm25_settings_out_of_their_range_are_refused_in_one_line(tiny_bi_encoder, tmp_path, argv, field):
    """On 11c4983 ``--bm25-k1 1e308`` built an index whose BM25 found nothing (a hybrid silently dense-only) and
    ``1e30`` made every BM25 score 0.0, with only a numpy overflow warning."""
    rc, _, err = _run(["index", "--corpus", str(_corpus(tmp_path / "c.jsonl")), "--out", str(tmp_path / "i"),
                       "--model", str(tiny_bi_encoder), "--backend", "onnx", "--bm25", *argv])
    assert rc == 2 and len(_errors(err)) == 1 and field in err, err
    assert not (tmp_path / "i").exists()


def test_bm25_at_the_bound_of_k1_still_scores(tiny_bi_encoder, tmp_path):
    """k1 = 100 (the bound) is an index whose BM25 ranks as rank_bm25's BM25Okapi does (no overflow, no zeros)."""
    import math

    from retr.retrieval.bm25 import K1_MAX

    rc, _, err = _run(["index", "--corpus", str(_corpus(tmp_path / "c.jsonl")), "--out", str(tmp_path / "i"),
                       "--model", str(tiny_bi_encoder), "--backend", "onnx", "--bm25", "--bm25-k1", str(K1_MAX)])
    assert rc == 0, err
    rc, out, err = _run(["search", str(tmp_path / "i"), "wolves tundra", "--mode", "bm25", "--json", "-k", "3"])
    hits = json.loads(out)["results"]
    assert rc == 0 and hits and all(math.isfinite(h["score"]) and h["score"] > 0 for h in hits), (out, err)
    assert hits[0]["id"] in ("d9", "d16")  # the two documents holding both words


@pytest.mark.parametrize("argv, message", [
    (["train", "mlm", "--lr", "nan"], "--lr must be a finite number in (0, 1]"),
    (["train", "mlm", "--mask-prob", "1.5"], "--mask-prob must be in (0, 1)"),
    (["train", "bi-encoder", "--self-supervised", "--dev-fraction", "inf"], "--dev-fraction must be a finite number in [0, 1)"),
    (["train", "bi-encoder", "--self-supervised", "--teacher-weight", "inf"], "--teacher-weight must be a finite number"),
])
def test_training_float_settings_out_of_range_are_refused_in_one_line(tmp_path, argv, message):
    """On 11c4983 ``--lr nan``, ``--mask-prob 1.5``, ``--dev-fraction inf`` and ``--teacher-weight inf`` were taken
    (a training run of NaN losses, or a dev split of every example)."""
    corpus = _corpus(tmp_path / "c.jsonl")
    rc, _, err = _run([*argv, "--corpus", str(corpus), "--out", str(tmp_path / "m")])
    assert rc == 2 and len(_errors(err)) == 1 and message in err, err


# -- 6. irds offline: one line, whichever call of ir_datasets downloads --------------------------------------------
def test_an_irds_dataset_that_downloads_offline_is_one_line(tmp_path, monkeypatch):
    """ir_datasets downloads ``beir/scifact/test`` inside ``docs_iter()`` itself (the call, before any
    iteration): on 11c4983 that call lay outside the guarded iteration, and offline `retr eval --dataset
    irds:beir/scifact/test` printed four chained tracebacks (socket, urllib3, requests) with exit 1. Here the
    dataset raises as requests does offline; nothing touches the network."""
    pytest.importorskip("ir_datasets")
    import requests

    from retr.eval import irds

    class Offline:
        def has_docs(self):
            return True

        has_queries = has_qrels = has_docs

        def docs_iter(self):
            try:
                raise OSError("[Errno -2] Name or service not known")
            except OSError as e:
                raise requests.exceptions.ConnectionError(
                    "HTTPSConnectionPool(host='public.ukp.informatik.tu-darmstadt.de', port=443): Max retries "
                    "exceeded with url: /thakur/BEIR/datasets/scifact.zip") from e

        queries_iter = qrels_iter = docs_iter

    monkeypatch.setattr(irds, "_load", lambda _id: Offline())
    rc, _, err = _run(["eval", "--dataset", "irds:beir/scifact/test", "--mode", "bm25"])
    assert rc == 2 and len(_errors(err)) == 1, err
    assert "ir_datasets could not provide the documents of 'beir/scifact/test'" in err and "~/.ir_datasets" in err


# -- 7. a change that cannot be written: one line, the index unchanged ------------------------------------------
def _state(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _mount(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"this machine allows no {argv[1:3]} mount: {r.stderr.strip()[:120]}")


def _fill(folder: Path) -> None:
    """Write zeros into ``folder`` until its file system is full."""
    with (folder / "ballast").open("wb") as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        with contextlib.suppress(OSError):
            fh.truncate(fh.tell())  # what was flushed stays; the handle closes cleanly


def test_add_and_delete_on_a_full_disk_are_one_line_and_leave_the_index_unchanged(built, tmp_path):
    """A small tmpfs filled to the last byte: on 11c4983 `retr add` and `retr delete` raised a raw ``OSError``
    (Errno 28); the published generation stayed intact and leftovers were removed, and so they must still be."""
    fs = tmp_path / "fs"
    fs.mkdir()
    _mount(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)])
    try:
        idx = _copy(built, fs / "g.idx")
        new = _corpus(tmp_path / "new.jsonl", [(f"n{i}", "", "solar wolves " * 400) for i in range(40)])
        ids = tmp_path / "ids.txt"
        ids.write_text("d1\n")
        _fill(fs)
        before = _state(idx)
        for argv in (["add", str(idx), "--corpus", str(new)], ["delete", str(idx), "--ids", str(ids)]):
            rc, _, err = _run(argv)
            assert rc == 2 and len(_errors(err)) == 1, (argv, err)
            assert "No space left on device" in err and "the index is unchanged" in err, err
            assert _state(idx) == before, f"{argv[0]}: the index changed or kept leftovers"
        (fs / "ballast").unlink()
        rc, out, err = _run(["search", str(idx), "wolves", "--mode", "bm25", "--json"])
        assert rc == 0 and json.loads(out)["results"], err
        assert _run(["delete", str(idx), "--ids", str(ids)])[0] == 0  # with room again, the change goes through
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_add_on_a_read_only_index_is_one_line_and_changes_nothing(built, tmp_path):
    """A read-only mount of the index: on 11c4983 `retr add` raised a raw ``OSError`` (Errno 30)."""
    idx = _copy(built, tmp_path / "g.idx")
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount(["mount", "--bind", str(idx), str(ro)])
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("this machine allows no read-only remount")
        before = _state(idx)
        ids = tmp_path / "ids.txt"
        ids.write_text("d1\n")
        for argv in (["add", str(ro), "--corpus", str(_corpus(tmp_path / "a.jsonl", [("a1", "", "alpha")]))],
                     ["delete", str(ro), "--ids", str(ids)], ["compact", str(ro)]):
            rc, _, err = _run(argv)
            assert rc == 2 and len(_errors(err)) == 1 and "Read-only file system" in err and "unchanged" in err, err
        assert _state(idx) == before
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_faiss_write_that_fails_is_one_line_and_leaves_the_index_unchanged(built, tmp_path, monkeypatch):
    """FAISS reports a full disk as ``RuntimeError`` from ``write_index``: on 11c4983 it escaped `retr add`."""
    import faiss

    idx = _copy(built, tmp_path / "g.idx")
    before = _state(idx)

    def full(_index, path):
        raise RuntimeError(f"Error: 'ret == (size_t)(1)' failed: write error in {path}: 28 (No space left on device)")

    monkeypatch.setattr(faiss, "write_index", full)
    rc, _, err = _run(["add", str(idx), "--corpus", str(_corpus(tmp_path / "a.jsonl", [("a1", "", "alpha")]))])
    assert rc == 2 and len(_errors(err)) == 1 and "No space left on device" in err and "unchanged" in err, err
    assert _state(idx) == before


# -- 8. a corpus without a single BM25 term: one line from the API as from the CLI ---------------------------------
def test_documents_without_any_bm25_term_are_one_line_from_the_api_and_the_cli(tiny_bi_encoder, tmp_path):
    """On 11c4983 ``Index.from_documents`` of empty texts raised bm25s's ``ValueError: max() arg is an empty
    sequence``, and so did `retr index` of documents holding only stopwords."""
    import retr

    model = str(tiny_bi_encoder)
    for docs in (["", ""], ["", "   "], ["the", "a of"]):
        with pytest.raises(RetrError, match=r"BM25 has no term to index: each of the 2 documents"):
            retr.Index.from_documents(docs, model=model, backend="onnx")
    stop = _corpus(tmp_path / "stop.jsonl", [("a", "", "the"), ("b", "", "a of it")])
    rc, _, err = _run(["index", "--corpus", str(stop), "--out", str(tmp_path / "i"), "--model", model,
                       "--backend", "onnx", "--bm25"])
    assert rc == 2 and len(_errors(err)) == 1 and "BM25 has no term to index" in err and "--no-bm25" in err, err
    assert not (tmp_path / "i").exists()
    with retr.Index.from_documents(["", ""], model=model, backend="onnx", bm25=False) as index:  # as it says
        assert index.ids == ["0", "1"]


# -- 9. minor: compiled entries keyed by content, stored choices checked against the bar, /doc ids, the docs ----
def test_a_copied_cache_reads_its_compiled_query_graph_back_without_compiling(tiny_bi_encoder, tmp_path,
                                                                             monkeypatch):
    """Compiled-store entries are named by the graph's content, not by where the cache lies: on 11c4983 their
    identity held the source graph's absolute path, so a copied ``RETR_CACHE`` compiled again and kept a second
    entry (~90 MB for MiniLM)."""
    import numpy as np

    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.runners import COMPILED
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    from .test_compiled import _compile_fails, _entries, _feed, _keep_every_blob

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    _keep_every_blob(monkeypatch)
    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    enc = BiEncoder(cfg)
    want = enc.query_graph.runner(_feed(enc))
    BiEncoder(cfg).query_graph.runner(_feed(enc))  # compiled and kept
    (entry,) = _entries(cache_home() / COMPILED)
    copy = tmp_path / "copied-cache"
    shutil.copytree(cache_home(), copy)
    monkeypatch.setenv("RETR_CACHE", str(copy))
    _compile_fails(monkeypatch)
    np.testing.assert_array_equal(BiEncoder(cfg).query_graph.runner(_feed(enc)), want)  # read back, not compiled
    assert [p.name for p in _entries(copy / COMPILED)] == [entry.name]


def test_a_stored_graph_choice_is_checked_against_the_noise_bar_on_read(tmp_path, caplog):
    """On 11c4983 a stored choice was trusted on its ``passed`` flag alone: a hand-edited entry whose chosen graph
    records ranking noise 0.9 against a bar of 0.05 was used. Its figures are now held to the bar of its role."""
    import logging

    from retr.retrieval.backends import chooser
    from retr.retrieval.backends.registry import CE_MAX_RANK_NOISE, MAX_RANK_NOISE

    store = chooser.ChoiceStore(tmp_path)
    path = tmp_path / "choices" / "k.json"
    caplog.set_level(logging.WARNING, logger="retr")
    for role, bar in ((chooser.QUERIES, MAX_RANK_NOISE), (chooser.PAIRS, CE_MAX_RANK_NOISE)):
        timings = (chooser.Timing("onnx", 0.002), chooser.Timing("openvino-int8", 0.001, rank_noise=bar / 2))
        store.put("k", chooser.Choice(role, "openvino-int8", "the fastest that passed", timings))
        assert store.get("k").backend == "openvino-int8"  # under the bar: used
        stored = json.loads(path.read_text())
        stored["candidates"][1]["rank_noise"] = 0.9  # edited by hand, "passed" left true
        path.write_text(json.dumps(stored))
        caplog.clear()
        assert store.get("k") is None, role
        assert f"ranking noise 0.9000, over the bar of {bar}: timed again" in caplog.text


def test_a_document_whose_id_holds_a_newline_is_fetched_over_http_and_errors_keep_their_shape(tiny_bi_encoder,
                                                                                              tmp_path):
    """On 11c4983 ``GET /doc/a%0Ab`` answered ``{"detail": "Not Found"}`` (the route's pattern stopped at the
    newline), not the document nor the documented ``{"error": ...}``; so did any unknown route."""
    import retr
    from retr.cli.serve_app import ServeConfig
    from retr.retrieval.encoder import EncoderConfig

    from .serving import Server

    out = tmp_path / "i"
    retr.Index.from_documents([{"id": "a\nb", "text": "wolves in the tundra"}, {"id": "c/d", "text": "solar"}],
                              out, model=str(tiny_bi_encoder), backend="onnx").close()
    server = Server(out, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        status, body = server.request("/doc/a%0Ab")
        assert status == 200 and body["id"] == "a\nb" and body["text"] == "wolves in the tundra", body
        assert server.request("/doc/c/d")[1]["id"] == "c/d"
        status, body = server.request("/doc/a%0Ac")
        assert status == 404 and set(body) == {"error"} and "no document" in body["error"], body
        status, body = server.request("/no/such/route")
        assert status == 404 and body == {"error": "Not Found"}, body
    finally:
        server.stop()


def test_every_index_attribute_the_index_format_page_names_exists_on_retr_index(built):
    """On 11c4983 docs/reference/index-format.md named ``index.generation``, which ``retr.Index`` does not have
    (``index.manifest.generation``)."""
    import re

    import retr

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "index-format.md").read_text()
    named = sorted(set(re.findall(r"`index\.([A-Za-z_][\w.]*)", page)))
    assert "manifest.generation" in named
    with retr.Index.load(built, backend="onnx") as index:
        for chain in named:
            value = index
            for attr in chain.split("."):
                assert hasattr(value, attr), f"index-format.md names `index.{chain}`: retr.Index has no {attr!r}"
                value = getattr(value, attr)
        assert index.manifest.generation == 0


# -- what held, kept as a test: a reader killed with kill -9 frees its generation -----------------------------------
def test_a_reader_killed_with_kill_9_frees_its_generation_for_the_next_writer(built, tmp_path):
    """The lease is an flock: the kernel drops it with the process. A generation a live reader holds is kept across
    a change; once that reader is killed with ``kill -9``, the next change removes it (at most the published
    generation is left)."""
    import signal
    import sys

    idx = _copy(built, tmp_path / "g.idx")
    reader = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, retr\n"
        f"index = retr.Index.load({str(idx)!r}, backend='onnx')\n"
        "index.search('wolves', k=3)\n"
        "print('open', flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "open"
        a = _corpus(tmp_path / "a.jsonl", [("a1", "", "alpha one")])
        assert _run(["add", str(idx), "--corpus", str(a)])[0] == 0
        assert (idx / "ids.json").is_file(), "generation 0 (at the root) is held by the reader: kept"
        reader.send_signal(signal.SIGKILL)
        assert reader.wait(30) == -signal.SIGKILL
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    b = _corpus(tmp_path / "b.jsonl", [("b1", "", "beta one")])
    assert _run(["add", str(idx), "--corpus", str(b)])[0] == 0
    assert not (idx / "ids.json").exists(), "the killed reader's generation was freed and removed"
    assert sorted(p.name for p in idx.iterdir() if p.name.startswith("gen-")) == ["gen-000002"]


def test_a_doc_store_cut_short_between_its_check_and_its_read_is_one_line_not_sigbus(tmp_path):
    """The doc store's records were read through a map: a file cut short after the size check and before the read
    (the check's window, microseconds wide) was a SIGBUS. Records are read with ``pread`` now; the check is
    disabled here to open the window on purpose, in a child process (a fault would kill it, not the suite)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from retr.indexes.docstore import DOCS, DocStore, write_docstore\n"
        "from retr.retrieval import mapped\n"
        "from retr.retrieval.types import Document\n"
        "from retr.retrieval.errors import RetrError\n"
        "folder = Path(sys.argv[1])\n"
        "docs = [Document(f'd{i}', '', 'text ' * 2000) for i in range(8)]\n"
        "write_docstore(folder, docs)\n"
        "store = DocStore(folder, [d.doc_id for d in docs])\n"
        "assert store.get(7).doc_id == 'd7'\n"
        "import os; os.truncate(folder / DOCS, 100)\n"
        "mapped.MappedFile.check = lambda self: None\n"
        "try:\n"
        "    store.get(7)\n"
        "except RetrError as e:\n"
        "    print('refused:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # -7: SIGBUS
    assert "refused:" in r.stdout and "position 7 is damaged" in r.stdout, r.stdout
