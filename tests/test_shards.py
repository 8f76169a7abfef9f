"""Sharded indexes: documents partitioned by a stable hash of their id, each query fanned out and merged. For
exact search the merged top-k equals the unsharded index's (ids and scores), in every mode, with filters, over
passages and through the reranker; BM25 keeps the whole collection's statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retr.cli.main import main
from retr.indexes.build import IndexConfig, build_index, shard_of
from retr.indexes.corpus import load_corpus
from retr.indexes.searcher import Searcher
from retr.indexes.shards import ShardedIndex
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.compose import IndexParts, build
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageConfig
from retr.retrieval.pipeline import PipelineConfig, parse
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

from .conftest import DOCS, QRELS, QUERIES, write_beir

WORDS = sorted({w.strip(".,").lower() for _, t, x in DOCS for w in f"{t} {x}".split()} - {""})
# the fixture's documents again, each with a different word of the fixture's vocabulary: no two vectors alike
MORE = [(f"x{i}", t, f"{x} {WORDS[(7 * i) % len(WORDS)]}") for i, (_, t, x) in enumerate(DOCS * 2) if x]
ALL_DOCS = [*DOCS, *MORE]
TOPIC = {d: ("even" if i % 2 == 0 else "odd") for i, (d, _, _) in enumerate(ALL_DOCS)}


@pytest.fixture(scope="module")
def built(tiny_bi_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    corpus_file = root / "c.jsonl"
    corpus_file.write_text("".join(json.dumps({"_id": d, "title": t, "text": x, "topic": TOPIC[d]}) + "\n"
                                   for d, t, x in ALL_DOCS))
    corpus = load_corpus(corpus_file)
    encoder = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"))
    out = {}
    for name, shards, passages in (("one", 1, None), ("three", 3, None), ("one-p", 1, "12:6"),
                                   ("three-p", 3, "12:6")):
        cfg = IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"), bm25=BM25Config(),
                          shards=shards, passages=PassageConfig.parse(passages) if passages else None)
        build_index(corpus, root / name, cfg, encoder=encoder)
        out[name] = root / name
    return corpus, encoder, out, corpus_file


def _run(folder, encoder, mode, k, allowed_topic=None, reranker=None):
    s = Searcher(folder, EncoderConfig(backend="onnx"))
    try:
        allowed = s.allowed({"topic": allowed_topic}) if allowed_topic else None
        return build(parse(mode), IndexParts(s.index, encoder), PipelineConfig(), reranker, allowed).search(QUERIES, k)
    finally:
        s.close()


def _same(a, b):
    assert list(a) == list(b)
    for qid in a:
        assert [h.doc_id for h in a[qid]] == [h.doc_id for h in b[qid]], qid
        np.testing.assert_allclose([h.score for h in a[qid]], [h.score for h in b[qid]], rtol=1e-6, atol=1e-6)


def test_partition_is_stable_and_complete(built):
    corpus, _, folders, _ = built
    owner = shard_of(corpus.ids, 3)
    assert owner.tolist() == shard_of(list(corpus.ids), 3).tolist()
    assert shard_of(["d1"], 3)[0] == int.from_bytes(__import__("hashlib").sha256(b"d1").digest()[:8], "big") % 3
    index = ShardedIndex(folders["three"])
    assert len(index.shards) == 3 and sorted(index.ids) == sorted(corpus.ids), "each document in exactly one shard"
    for i, shard in enumerate(index.shards):
        assert set(shard.ids) == {d for d, o in zip(corpus.ids, owner.tolist(), strict=True) if o == i}
        assert shard.manifest["shard"] == {"index": i, "of": 3, "partition": "sha256(id)[:8] mod shards"}


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "bm25+rm3", "fuse(bm25,bm25+rm3,dense)"])
@pytest.mark.parametrize("k", [5, 1000])
def test_merged_top_k_equals_the_unsharded_index(built, mode, k):
    _, encoder, folders, _ = built
    _same(_run(folders["three"], encoder, mode, k), _run(folders["one"], encoder, mode, k))


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "bm25+rm3"])
def test_filters_and_passages_over_shards(built, mode):
    _, encoder, folders, _ = built
    _same(_run(folders["three"], encoder, mode, 6, "odd"), _run(folders["one"], encoder, mode, 6, "odd"))
    _same(_run(folders["three-p"], encoder, mode, 7), _run(folders["one-p"], encoder, mode, 7))
    _same(_run(folders["three-p"], encoder, mode, 4, "even"), _run(folders["one-p"], encoder, mode, 4, "even"))


def test_rerank_over_shards(built, tiny_cross_encoder):
    _, encoder, folders, _ = built
    reranker = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), depth=8, max_length=64))
    for name in ("three", "three-p"):
        _same(_run(folders[name], encoder, "hybrid+rerank", 8, reranker=reranker),
              _run(folders[name.replace("three", "one")], encoder, "hybrid+rerank", 8, reranker=reranker))


def test_bm25_shards_keep_the_collections_statistics(built):
    """A shard built with its own statistics would score differently: the shards' scores are the whole's."""
    import bm25s

    _, _, folders, _ = built
    whole = bm25s.BM25.load(str(folders["one"] / "bm25"), mmap=False)
    index = ShardedIndex(folders["three"])
    one_ids = json.loads((folders["one"] / "ids.json").read_text())
    for shard in index.shards:
        part = bm25s.BM25.load(str(shard.folder / "bm25"), mmap=False)
        query = [whole.vocab_dict[w] for w in ("solar", "water", "wolv") if w in whole.vocab_dict]
        rows = [one_ids.index(d) for d in shard.ids]
        np.testing.assert_array_equal(part.get_scores_from_ids(query), whole.get_scores_from_ids(query)[rows])


def test_cli_eval_and_refusals(built, tiny_bi_encoder, tmp_path, capsys):
    _, _, folders, corpus_file = built
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus_file), "--out", str(out), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--shards", "2"]) == 0
    assert "in 2 shards" in capsys.readouterr().out
    assert main(["search", str(out), "wolves in the tundra", "--mode", "hybrid", "--json", "-k", "6"]) == 0
    sharded = json.loads(capsys.readouterr().out)["results"]
    assert main(["search", str(folders["one"]), "wolves in the tundra", "--mode", "hybrid", "--json", "-k", "6"]) == 0
    single = json.loads(capsys.readouterr().out)["results"]
    assert [(h["id"], h["title"], h["text"]) for h in sharded] == [(h["id"], h["title"], h["text"]) for h in single]
    data = write_beir(tmp_path / "beir", DOCS, QUERIES, QRELS)
    common = ["eval", "--dataset", str(data), "--model", str(tiny_bi_encoder), "--backend", "onnx", "--no-download",
              "--warmup", "0", "--no-cache"]
    assert main([*common, "--out", str(tmp_path / "a.json")]) == 0
    assert main([*common, "--shards", "3", "--out", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert b["index"]["manifest"]["format"] == "retr-sharded-index"
    for p in ("bm25", "dense", "hybrid"):
        assert a["pipelines"][p]["metrics"] == b["pipelines"][p]["metrics"]
    capsys.readouterr()
    (tmp_path / "ids.txt").write_text("d1\n")
    assert main(["delete", str(out), "--ids", str(tmp_path / "ids.txt")]) != 0
    assert "a sharded index cannot change yet" in capsys.readouterr().err
    assert main(["delete", str(out / "shard-000"), "--ids", str(tmp_path / "ids.txt")]) != 0
    assert "cannot change on its own" in capsys.readouterr().err
    manifest = out / "shard-001" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"num_docs"', '"num_docs" ', 1))
    with pytest.raises(RetrError, match="shard-001/manifest.json: not the shard this index was built with"):
        ShardedIndex(out)
    assert main(["index", "--corpus", str(corpus_file), "--out", str(tmp_path / "many"), "--model",
                 str(tiny_bi_encoder), "--backend", "onnx", "--shards", "500"]) != 0
    assert "would hold no document" in capsys.readouterr().err and not (tmp_path / "many").exists()
