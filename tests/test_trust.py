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
