"""The reranker check as its own step: `retr check-reranker IDX MODEL` measures a cross-encoder from another corpus
on the index's pseudo-queries once and stores it; `retr search` (and the API) only read the stored check and never
build an index."""

from __future__ import annotations

import json
import shutil

from retr.cli.main import main
from retr.eval import pseudo
from retr.retrieval.artifacts import cache_home

from .conftest import DOCS, write_beir


def _long_docs(n: int = 40) -> list[tuple[str, str, str]]:
    texts = [t for _, _, t in DOCS if t]
    return [(f"L{i}", "", " ".join(texts[(i * k) % len(texts)] for k in (1, 3, 7))) for i in range(n)]


def test_search_reads_the_check_that_check_reranker_stores(tiny_cross_encoder, tiny_bi_encoder, tmp_path, capsys,
                                                           monkeypatch):
    folder = write_beir(tmp_path / "long", _long_docs(), {"q1": "solar"}, {"q1": {"L1": 1}})
    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(folder), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--max-length", "64"]) == 0
    ce = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder, ce)
    (ce / "retr_manifest.json").write_text(json.dumps({"interpolation": 0.6, "corpus_sha256": "0" * 64}))
    search = ["search", str(idx), "solar panels", "--mode", "hybrid", "--rerank", str(ce), "--rerank-depth", "5",
              "--rerank-max-length", "32", "--json", "-k", "3"]
    real_check = pseudo.check_reranker

    def no_check(*a, **k):
        raise AssertionError("a search ran the reranker check")

    monkeypatch.setattr(pseudo, "check_reranker", no_check)
    capsys.readouterr()
    assert main(search) == 0  # not checked yet: the trained weight, with a warning; nothing built
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3
    assert not (cache_home() / "rerank-checks").exists()

    monkeypatch.setattr(pseudo, "check_reranker", real_check)
    assert main(["check-reranker", str(idx), str(ce), "--rerank-depth", "5", "--rerank-max-length", "32"]) == 0
    out = capsys.readouterr().out
    assert f"{ce} on {idx}: reranker weight" in out and "(checked): trained on another corpus; on" in out
    stored = list((cache_home() / "rerank-checks").glob("*.json"))
    assert len(stored) == 1 and "gain_low" in json.loads(stored[0].read_text())

    monkeypatch.setattr(pseudo, "check_reranker", no_check)  # stored: nothing measured again, by either command
    assert main(["check-reranker", str(idx), str(ce), "--rerank-depth", "5", "--rerank-max-length", "32"]) == 0
    assert "(checked)" in capsys.readouterr().out
    assert main(search) == 0
    from retr.indexes.searcher import Searcher
    from retr.retrieval.rerank import RerankConfig

    s = Searcher(idx, rerank=RerankConfig(model=str(ce), depth=5, max_length=32))
    try:
        m = s.index.manifest
        assert s.reranker(str(ce)).weight_for(m["corpus"]["sha256"], m["dense"]["model"]["hash"]).source == "checked"
    finally:
        s.close()
