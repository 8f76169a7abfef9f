"""Never silently wrong: model identity wherever a model lives, safe outputs, permissions, a quiet root logger."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat

import numpy as np
import pytest

from retr.cli.main import main
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef

from .conftest import DOCS


def _corpus(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in DOCS))
    return p


def _nudge_one_weight(folder) -> None:
    from safetensors.numpy import load_file, save_file

    path = next(folder.rglob("model.safetensors"))
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] += 1e-3
    save_file(tensors, str(path))


def test_two_models_under_a_cache_path_never_share_an_identity(tiny_bi_encoder, tmp_path, capsys, caplog):
    a, b = tmp_path / ".cache" / "hub" / "a", tmp_path / ".cache" / "hub" / "b"
    shutil.copytree(tiny_bi_encoder, a)
    shutil.copytree(tiny_bi_encoder, b)
    _nudge_one_weight(b)
    ra, rb = ModelRef.resolve(str(a)), ModelRef.resolve(str(b))
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing
    assert ra.hash != rb.hash and empty not in (ra.hash, rb.hash)
    c = tmp_path / "elsewhere" / "copy-of-a"
    shutil.copytree(a, c)
    assert ModelRef.resolve(str(c)).hash == ra.hash  # the same files: one identity, wherever they live
    corpus = _corpus(tmp_path)
    caplog.set_level(logging.INFO, logger="retr")
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "ia"), "--model", str(a),
                 "--backend", "onnx"]) == 0
    caplog.clear()
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "ib"), "--model", str(b),
                 "--backend", "onnx"]) == 0
    assert "embedding cache used" not in caplog.text, "model B must not get model A's vectors"
    assert len(list((tmp_path / "retr-cache" / "embeddings").iterdir())) == 2
    assert main(["search", str(tmp_path / "ia"), "solar", "--model", str(b), "--backend", "onnx"]) == 2
    assert "built with model" in capsys.readouterr().err
    caplog.clear()
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "ic"), "--model", str(c),
                 "--backend", "onnx"]) == 0
    assert "embedding cache used" in caplog.text  # the copy of A shares A's cache entry


def test_a_folder_without_model_files_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "README.md").write_text("x")
    h = ModelRef.resolve(str(tmp_path / "m")).hash  # config.json alone defines something
    (tmp_path / "m" / "README.md").write_text("changed")
    assert ModelRef.resolve(str(tmp_path / "m")).hash == h  # docs are not the model
    (tmp_path / "n").mkdir()
    with pytest.raises(RetrError, match="not a sentence-transformers or transformers model folder"):
        ModelRef.resolve(str(tmp_path / "n"))


def test_outputs_take_the_umasks_permissions(tiny_bi_encoder, tmp_path):
    old = os.umask(0o022)
    try:
        corpus = _corpus(tmp_path)
        assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--model",
                     str(tiny_bi_encoder), "--backend", "onnx"]) == 0
        assert stat.S_IMODE((tmp_path / "idx").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "idx" / "manifest.json").stat().st_mode) == 0o644
        from retr.retrieval.artifacts import atomic_write_text

        atomic_write_text(tmp_path / "report.json", "{}")
        assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_int8_quantisation_leaves_the_root_logger_alone(tiny_bi_encoder):
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    root = logging.getLogger()
    before = list(root.handlers)
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx-int8"))
    assert enc.graph is not None and enc.graph.variant == "onnx-int8"
    assert root.handlers == before, "a library configured the root logger: every record would print twice"


def test_embedding_cache_entries_carry_a_checksum_and_bad_vectors_are_discarded(tmp_path, caplog):
    from retr.indexes.cache import EmbeddingCache
    from retr.retrieval.artifacts import file_sha256

    cache = EmbeddingCache(tmp_path)
    v = np.eye(4, dtype=np.float32)
    cache.save("k", v, {})
    got, meta = cache.load("k", 4, 4)
    np.testing.assert_array_equal(got, v)
    assert len(meta["sha256"]) == 64
    unnormalised = v * 19.0
    np.save(cache.path("k") / "embeddings.npy", unnormalised)
    meta["sha256"] = file_sha256(cache.path("k") / "embeddings.npy")
    (cache.path("k") / "meta.json").write_text(json.dumps(meta))  # a checksum that matches: the norms still fail
    assert cache.load("k", 4, 4) is None and "norm 19" in caplog.text and not cache.path("k").exists()


def test_an_embedding_entry_holding_another_entrys_files_is_discarded_not_used(tmp_path, caplog):
    """Another entry's consistent files (vectors of another corpus, same shape) copied into an entry's folder: its
    info names another key and is discarded, and so is an earlier retr's entry (no key recorded) whose corpus
    checksum differs from the one asked for; matching info is used."""
    import shutil

    from retr.indexes.cache import EmbeddingCache

    cache = EmbeddingCache(tmp_path)
    a, b = np.eye(4, dtype=np.float32), np.eye(4, dtype=np.float32)[::-1].copy()
    cache.save("a", a, {"corpus_sha256": "A"})
    cache.save("b", b, {"corpus_sha256": "B"})
    shutil.rmtree(cache.path("a"))
    shutil.copytree(cache.path("b"), cache.path("a"))
    assert cache.load("a", 4, 4) is None and "another corpus" in caplog.text and not cache.path("a").exists()
    meta = json.loads((cache.path("b") / "meta.json").read_text())
    del meta["key"]  # as an earlier retr wrote it
    (cache.path("b") / "meta.json").write_text(json.dumps(meta))
    got, _ = cache.load("b", 4, 4, expect={"corpus_sha256": "B", "model_hash": "not recorded: not compared"})
    np.testing.assert_array_equal(got, b)
    assert cache.load("b", 4, 4, expect={"corpus_sha256": "A"}) is None and not cache.path("b").exists()


class _Hang(Exception):
    pass


def _within(seconds: int):
    """A context in which a blocked read fails the test instead of hanging it."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def ctx():
        def stop(*_):
            raise _Hang(f"blocked for {seconds} s")
        old = signal.signal(signal.SIGALRM, stop)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return ctx()


@pytest.mark.parametrize("damage", ["a FIFO", "a symlink to /dev/zero", "files as a list", "another dim"])
def test_a_graph_manifest_that_is_no_file_or_lies_is_discarded_and_the_graph_made_again(tiny_bi_encoder, caplog,
                                                                                        damage):
    """A cached graph's manifest that is a FIFO (read, it would block forever), a symlink to an endless device, or
    that records its files as a list or another vector width than its graph gives: the graph is discarded with a
    warning and made again, with the same vectors."""
    import os

    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")
    want = BiEncoder(cfg).encode(["wolves in the forest"])
    manifest = BiEncoder(cfg).graph.path.parent / "manifest.json"
    meta = json.loads(manifest.read_text())
    manifest.unlink()
    if damage == "a FIFO":
        os.mkfifo(manifest)
    elif damage == "a symlink to /dev/zero":
        manifest.symlink_to("/dev/zero")
    else:
        meta = {**meta, "files": list(meta["files"])} if damage == "files as a list" else {**meta, "dim": 128}
        manifest.write_text(json.dumps(meta))
    with _within(60), caplog.at_level("WARNING", logger="retr"):
        enc = BiEncoder(cfg)
        got = enc.encode(["wolves in the forest"])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert any("damaged" in r.getMessage() for r in caplog.records)
    assert json.loads(manifest.read_text())["dim"] == enc.dim == got.shape[1]  # made again, whole


@pytest.mark.parametrize("damage", ["a FIFO", "a symlink to /dev/zero", "passed as a string", "ms NaN",
                                    "ms negative", "noise a string"])
def test_a_stored_choice_that_is_no_file_or_holds_impossible_values_is_timed_again(tmp_path, caplog, damage):
    import os

    from retr.retrieval.backends import chooser
    from retr.retrieval.backends.chooser import QUERIES, Timing

    store = chooser.ChoiceStore(tmp_path)
    store.put("k", chooser.choose(QUERIES, [Timing("openvino", 0.004), Timing("onnx", 0.003, rank_noise=0.01)],
                                  "openvino"))
    path = tmp_path / "choices" / "k.json"
    stored = json.loads(path.read_text())
    path.unlink()
    first = dict(stored["candidates"][0])
    if damage == "a FIFO":
        os.mkfifo(path)
    elif damage == "a symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        first.update({"passed as a string": {"passed": "false"}, "ms NaN": {"ms": float("nan")},
                      "ms negative": {"ms": -1.0}, "noise a string": {"rank_noise": "low"}}[damage])
        path.write_text(json.dumps({**stored, "candidates": [first, *stored["candidates"][1:]]}))
    with _within(30), caplog.at_level("WARNING", logger="retr"):
        assert store.get("k") is None
    assert "timed again" in caplog.text


def test_a_stored_precision_probe_with_impossible_figures_is_measured_again(monkeypatch, caplog):
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends import precision

    monkeypatch.setattr(precision, "measure_apart", lambda threads: precision.PrecisionTiming(7.0, 14.0))
    precision.timing.cache_clear()
    got = precision.timing("a simulated CPU", 2)
    path = cache_home() / "choices" / f"{precision._key('a simulated CPU', 2)}.json"
    assert got == precision.PrecisionTiming(7.0, 14.0) and path.is_file()
    for bad in ({"bf16_ms": float("nan"), "fp32_ms": 14.0}, {"bf16_ms": 7.0, "fp32_ms": 0}, [7.0, 14.0]):
        path.write_text(json.dumps(bad))
        precision.timing.cache_clear()
        monkeypatch.setattr(precision, "measure_apart", lambda threads: precision.PrecisionTiming(6.0, 15.0))
        with caplog.at_level("WARNING", logger="retr"):
            assert precision.timing("a simulated CPU", 2) == precision.PrecisionTiming(6.0, 15.0)
        assert "measured again" in caplog.text
        caplog.clear()
    precision.timing.cache_clear()


def test_an_index_is_built_where_the_cache_cannot_be_written(tiny_bi_encoder, tmp_path, monkeypatch, caplog):
    """``RETR_CACHE`` naming a file: the graph falls back to torch and the vectors are not cached (warnings); the
    index is written all the same."""
    from retr.cli.main import main

    (tmp_path / "a file").write_text("in the way")
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "a file"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": f"document {i} about wolves"}) + "\n"
                              for i in range(5)))
    with caplog.at_level("WARNING", logger="retr"):
        assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "i.idx"), "--model",
                     str(tiny_bi_encoder)]) == 0
    assert (tmp_path / "i.idx" / "manifest.json").is_file() and "not cached" in caplog.text


def test_an_onnx_graph_whose_manifest_lies_about_its_width_is_discarded_when_its_session_is_made(tiny_bi_encoder,
                                                                                               caplog):
    """ONNX Runtime declares a graph's output width only once its session is made: there a manifest recording
    another width is a one-line error naming the graph's folder, the entry is discarded, and the next run makes
    the graph again with the right vectors."""
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    cfg = EncoderConfig(model=str(tiny_bi_encoder), backend="onnx")
    want = BiEncoder(cfg).encode(["wolves in the forest"])
    folder = BiEncoder(cfg).graph.path.parent
    meta = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**meta, "dim": meta["dim"] + 1}))
    with caplog.at_level("WARNING", logger="retr"), pytest.raises(RetrError, match=str(folder)):
        BiEncoder(cfg).encode(["wolves in the forest"])
    assert not folder.exists() and "damaged" in caplog.text
    np.testing.assert_allclose(BiEncoder(cfg).encode(["wolves in the forest"]), want, atol=1e-6)
