"""Query and document prompts: read from the model's sentence-transformers config, overridable, applied to every
document and query, recorded in the index manifest, the embedding cache key and the eval report; an index searched
with other prompts is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from retr.cli.main import main
from retr.indexes.folder import IndexFolder
from retr.retrieval.encoder import BiEncoder, EncoderConfig

QUERY, DOC = "query: ", "passage: "


@pytest.fixture(scope="module")
def prompted(tiny_bi_encoder, tmp_path_factory):
    """The tiny model with prompts in its config_sentence_transformers.json (as e5 and bge models ship them)."""
    folder = tmp_path_factory.mktemp("prompted") / "st"
    shutil.copytree(tiny_bi_encoder, folder)
    path = folder / "config_sentence_transformers.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg.update(prompts={"query": QUERY, "document": DOC}, default_prompt_name=None)
    path.write_text(json.dumps(cfg))
    return folder


def test_prompts_come_from_the_model_config_and_are_applied(prompted):
    enc = BiEncoder(EncoderConfig(model=str(prompted), backend="onnx"))
    assert (enc.prompts.query, enc.prompts.document) == (QUERY, DOC)
    text = "wolves hunt in packs"
    doc = enc.encode_corpus([text]).embeddings
    assert np.allclose(doc, enc.encode([DOC + text]), atol=1e-6)
    assert not np.allclose(doc, enc.encode([text]), atol=1e-3)
    assert np.allclose(enc.encode_queries([text]), enc.encode([QUERY + text]), atol=1e-6)
    other = BiEncoder(EncoderConfig(model=str(prompted), backend="onnx", query_prompt="", doc_prompt="search: "))
    assert (other.prompts.query, other.prompts.document) == ("", "search: ")


def test_prompts_are_recorded_and_checked_on_search(prompted, tiny_dataset, tmp_path, capsys):
    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--model", str(prompted),
                 "--backend", "onnx"]) == 0
    model = IndexFolder(idx).manifest["dense"]["model"]
    assert model["prompts"] == {"query": QUERY, "document": DOC}
    assert main(["search", str(idx), "solar panels", "--backend", "onnx", "--json"]) == 0
    capsys.readouterr()
    assert main(["search", str(idx), "solar panels", "--backend", "onnx", "--query-prompt", "question: "]) == 2
    err = capsys.readouterr().err
    assert "prompt" in err and "question: " in err and QUERY in err and err.count("\n") == 1

    plain = tmp_path / "plain"  # the same model and corpus without the document prompt: other vectors, not a cache hit
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(plain), "--model", str(prompted),
                 "--backend", "onnx", "--doc-prompt", "", "--query-prompt", ""]) == 0
    a, b = IndexFolder(idx), IndexFolder(plain)
    assert a.manifest["dense"]["encode"]["cache_key"] != b.manifest["dense"]["encode"]["cache_key"]
    assert not np.allclose(a.faiss_index.reconstruct(0), b.faiss_index.reconstruct(0), atol=1e-4)
    # a search takes the index's prompts by default, not the model's
    assert main(["search", str(plain), "solar panels", "--backend", "onnx"]) == 0
    assert main(["search", str(plain), "solar panels", "--backend", "onnx", "--query-prompt", QUERY]) == 2


def test_eval_reports_the_prompts(prompted, tiny_dataset, tmp_path):
    report = tmp_path / "r.json"
    assert main(["eval", "--dataset", str(tiny_dataset), "--model", str(prompted), "--backend", "onnx",
                 "--pipelines", "dense", "--k-values", "10", "--warmup", "1", "--out", str(report)]) == 0
    env = json.loads(report.read_text())["environment"]
    assert env["prompts"] == {"query": QUERY, "document": DOC}
