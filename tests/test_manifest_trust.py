"""Confined, bounded manifests and model folders; `retr add` reads documents as the index's own were; the lock
message names the operation (issue 41, cases 4, 5, 9, 17, 19 and 23). Whatever could hang runs in a child process
with a time limit, so that a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from retr.cli.main import main
from retr.indexes.folder import IndexFolder

from .conftest import DOCS


def _run(argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, "\n".join(line for line in err.getvalue().splitlines() if not line.startswith("[retr]"))


def _child(code: str, timeout: float = 60) -> tuple[int, str]:
    """``code`` in a child Python, killed after ``timeout`` s (then the test fails: it hung)."""
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s: {code[:200]}")
    return p.returncode, p.stdout + p.stderr


def _write(path, docs, id_field="_id"):
    path.write_text("".join(json.dumps({id_field: d, "title": t, "text": x}) + "\n" for d, t, x in docs))
    return path


@pytest.fixture(scope="module")
def built(tiny_bi_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    for name, docs in (("a", DOCS[:8]), ("b", DOCS[8:16])):
        assert main(["-q", "index", "--corpus", str(_write(root / f"{name}.jsonl", docs)), "--out", str(root / name),
                     "--model", str(tiny_bi_encoder), "--backend", "onnx"]) == 0
    assert main(["-q", "index", "--corpus", str(root / "a.jsonl"), "--out", str(root / "sharded"), "--model",
                 str(tiny_bi_encoder), "--backend", "onnx", "--shards", "2"]) == 0
    return root


def _copy(built, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(built / name, dst)
    return dst


def _edit(folder, change) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _refused(folder, pattern: str, mode: str = "bm25") -> None:
    rc, err = _run(["search", str(folder), "wolves", "--mode", mode, "--backend", "onnx"])
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("retr: error: "), (rc, err)
    assert pattern in err, err


# -- case 5: paths outside the folder, checks turned off --------------------------------------------------------
def test_a_manifest_path_outside_the_folder_is_refused(built, tmp_path):
    other = built / "b"
    cases = {
        "absolute dense.file": lambda m: m["dense"].update(file=str(other / "dense.faiss")),
        "dense.file through ..": lambda m: m["dense"].update(file="../b/dense.faiss"),
        "bm25.dir through ..": lambda m: m["bm25"].update(dir="../b/bm25"),
        "absolute files key": lambda m: m["files"].update({str(other / "ids.json"): m["files"]["ids.json"]}),
    }
    for label, change in cases.items():
        idx = _copy(built, "a", tmp_path / label.replace(" ", "-"))
        _edit(idx, change)
        for mode in ("dense", "bm25"):
            rc, err = _run(["search", str(idx), "wolves", "--mode", mode, "--backend", "onnx"])
            assert rc == 2 and len(err.splitlines()) == 1 and "outside the folder" in err, (label, mode, err)


def test_a_manifest_that_turns_checks_off_is_refused(built, tmp_path):
    idx = _copy(built, "a", tmp_path)
    _edit(idx, lambda m: m.update(files={}))
    _refused(idx, "'files' is empty")
    idx = _copy(built, "a", tmp_path / "no-ids")
    _edit(idx, lambda m: m["files"].pop("ids.json"))
    _refused(idx, "'ids.json' has no checksum")
    idx = _copy(built, "a", tmp_path / "planted")
    (idx / "bm25" / "extra.npy").write_bytes(b"x")
    _refused(idx, "not a part its manifest records")


# -- case 9: special files never hashed -------------------------------------------------------------------------
@pytest.mark.parametrize("special", ["dev-zero", "fifo", "symlink-to-dev-zero", "dotdot-fifo"])
def test_hashing_never_opens_a_special_file(built, tmp_path, special):
    idx = _copy(built, "a", tmp_path)
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    if special == "dev-zero":
        _edit(idx, lambda m: m["files"].update({"/dev/zero": {"sha256": "0" * 64, "bytes": 0}}))
    elif special == "fifo":
        (idx / "ids.json").unlink()
        os.mkfifo(idx / "ids.json")
        _edit(idx, lambda m: m["files"]["ids.json"].update(bytes=0))
    elif special == "symlink-to-dev-zero":
        (idx / "ids.json").unlink()
        os.symlink("/dev/zero", idx / "ids.json")
        _edit(idx, lambda m: m["files"]["ids.json"].update(bytes=0))
    else:
        _edit(idx, lambda m: m["files"].update({"../a-fifo": {"sha256": "0" * 64, "bytes": 0}}))
    code = ("import sys; from retr.cli.main import main; "
            f"sys.exit(main(['search', {str(idx)!r}, 'wolves', '--mode', 'bm25']))")
    rc, out = _child(code)
    lines = [x for x in out.splitlines() if not x.startswith("[retr]")]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("retr: error: "), out


# -- case 17: sharded manifests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("label,change,pattern", [
    ("no shards", lambda m: m.update(shards=[]), "'shards' is empty"),
    ("a shard that is a string", lambda m: m["shards"].__setitem__(0, "shard-000"), "not an object"),
    ("a shard without dir", lambda m: m["shards"][0].pop("dir"), "has no 'dir'"),
    ("a shard whose dir is null", lambda m: m["shards"][0].update(dir=None), "has no 'dir'"),
    ("a shard dir outside", lambda m: m["shards"][0].update(dir="../b"), "outside the folder"),
])
def test_a_damaged_sharded_manifest_is_one_line(built, tmp_path, label, change, pattern):
    idx = _copy(built, "sharded", tmp_path)
    _edit(idx, change)
    for mode in ("bm25", "dense", "hybrid"):
        _refused(idx, pattern, mode)


# -- case 19 and case 9 (models): model folders ------------------------------------------------------------------
def _model_copy(tiny_bi_encoder, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny_bi_encoder, dst)
    return dst


@pytest.mark.parametrize("fault", ["symlink-dev-zero", "symlink-proc-self", "symlink-loop", "fifo",
                                   "custom-module", "pickle-only"])
def test_a_hostile_model_folder_is_one_line_and_never_hangs(tiny_bi_encoder, tmp_path, fault):
    model = _model_copy(tiny_bi_encoder, tmp_path)
    if fault == "symlink-dev-zero":
        os.symlink("/dev/zero", model / "extra_config.json")
    elif fault == "symlink-proc-self":
        os.symlink("/proc/self", model / "runtime")
    elif fault == "symlink-loop":
        os.symlink(model, model / "loop")
    elif fault == "fifo":
        os.mkfifo(model / "vocab_extra.txt")
    elif fault == "custom-module":
        modules = json.loads((model / "modules.json").read_text())
        modules[0]["type"] = "evil_package.Backdoor"
        (model / "modules.json").write_text(json.dumps(modules))
    else:
        weights = next(model.rglob("model.safetensors"))
        shutil.move(weights, weights.with_name("pytorch_model.bin"))
    corpus = _write(tmp_path / "c.jsonl", DOCS[:4])
    code = ("import sys; from retr.cli.main import main; "
            f"sys.exit(main(['index', '--corpus', {str(corpus)!r}, '--out', {str(tmp_path / 'o')!r}, "
            f"'--model', {str(model)!r}, '--backend', 'onnx']))")
    rc, out = _child(code, timeout=90)
    lines = [x for x in out.splitlines() if not x.startswith("[retr]")]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("retr: error: "), out
    assert "weights_only=False" not in out and "Traceback" not in out
    assert not (tmp_path / "o").exists()


# -- case 4: `retr add` reads documents with the fields the index was built with ---------------------------------
def test_add_uses_the_id_and_title_fields_the_index_was_built_with(tiny_bi_encoder, tmp_path, capsys):
    docs = [(f"D{i}", t, x) for i, (_, t, x) in enumerate(DOCS[:6], start=1)]
    base = tmp_path / "docno.jsonl"
    base.write_text("".join(json.dumps({"id": f"row{i}", "docno": d, "title": t, "text": x}) + "\n"
                            for i, (d, t, x) in enumerate(docs)))
    idx = tmp_path / "idx"
    assert main(["-q", "index", "--corpus", str(base), "--out", str(idx), "--id-field", "docno", "--title-field", "",
                 "--model", str(tiny_bi_encoder), "--backend", "onnx"]) == 0
    update = tmp_path / "update.jsonl"
    update.write_text(json.dumps({"id": "row9", "docno": "D1", "title": "Quasar", "text": "Solar panels, again."})
                      + "\n")
    capsys.readouterr()
    assert main(["add", str(idx), "--corpus", str(update)]) == 0
    assert "added 0, updated 1" in capsys.readouterr().out
    index = IndexFolder(idx)
    try:
        assert "row9" not in index.ids and index.ids.count("D1") == 1
        doc = index.docstore.get(index.ids.index("D1"))
        assert doc.text == "Solar panels, again." and doc.title == ""  # --title-field '' holds for added documents
    finally:
        index.close()


# -- case 23: the lock message names the operation ----------------------------------------------------------------
def test_the_lock_message_names_the_operation(built, tmp_path):
    from retr.retrieval.artifacts import writer_lock

    idx = _copy(built, "a", tmp_path)
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n")
    add = _write(tmp_path / "add.jsonl", DOCS[8:9])
    for op, argv in (("add", ["add", str(idx), "--corpus", str(add)]), ("delete", ["delete", str(idx), "--ids", str(ids)]),
                     ("compact", ["compact", str(idx)])):
        with writer_lock(idx):  # held by a build (`retr index`)
            rc, err = _run(argv)
        assert rc == 2 and len(err.splitlines()) == 1 and "another retr process is writing it" in err, err
        assert f"cannot {op} it" in err and f"run `retr {op}` again" in err and "--out" not in err, err
        assert "(`retr index`, pid" in err, err  # who holds it
