"""Graphs built from a BERT bi-encoder's weights (``retrieval/backends/direct.py``): the same function as the
torch model, checked against a numpy forward pass, no torch on a first run, and torch's export for the rest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from retr.retrieval.backends import direct, registry
from retr.retrieval.backends.export import EMBEDDING
from retr.retrieval.backends.graphs import load_or_export
from retr.retrieval.backends.runners import OpenVinoRunner
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError

TEXTS = ["solar panels", "wolves hunt in packs and live in forests and tundra " * 3, "tea",
         "coffee beans are roasted ground and brewed with hot water", "x"]


def _variant(tiny_bi_encoder: Path, tmp_path: Path, pooling: str | None = None, **config) -> Path:
    """A copy of the tiny bi-encoder with another pooling mode or other config.json values."""
    out = tmp_path / "variant"
    shutil.copytree(tiny_bi_encoder, out)
    if pooling is not None:
        p = out / "1_Pooling" / "config.json"
        cfg = json.loads(p.read_text())
        for k in list(cfg):
            if k.startswith("pooling_mode"):
                del cfg[k]
        cfg["pooling_mode"] = pooling
        p.write_text(json.dumps(cfg))
    if config:
        (folder,) = {c.parent for c in out.glob("**/config.json") if "model_type" in c.read_text()}
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    return out


def _built_embeddings(model: Path, tmp_path: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the built graph's fp32 embeddings, the numpy reference's) of ``texts``, one padded batch for the graph."""
    import openvino as ov

    built = direct.build_embedding(model)
    assert built is not None
    ov.save_model(built.model, str(tmp_path / "g.xml"), compress_to_fp16=False)
    runner = OpenVinoRunner(tmp_path / "g.xml", 1, "fp32")
    return runner(built.reference.feed(texts, 64)), built.reference.embed(texts, 64)


@pytest.mark.parametrize("variant", [{}, {"pooling": "cls"}, {"hidden_act": "gelu_new"}])
def test_a_graph_built_from_the_weights_computes_what_sentence_transformers_does(tiny_bi_encoder, tmp_path,
                                                                                 variant):
    from sentence_transformers import SentenceTransformer

    model = _variant(tiny_bi_encoder, tmp_path, **variant) if variant else tiny_bi_encoder
    st = SentenceTransformer(str(model), device="cpu")
    want = st.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    got, reference = _built_embeddings(model, tmp_path, TEXTS)
    # both agree with sentence-transformers to fp32 rounding, the graph on a padded batch
    np.testing.assert_allclose((got * want).sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose((reference * want).sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_the_numpy_reference_is_minilm_as_sentence_transformers_computes_it():
    from sentence_transformers import SentenceTransformer

    from retr.retrieval.models import bundled_model_path

    path = bundled_model_path()
    spec = direct.bert_spec(path)
    assert spec is not None and (spec.layers, spec.hidden, spec.heads, spec.pooling) == (6, 384, 12, "mean")
    reference = direct.NumpyBert(spec, direct.load_weights(spec), path)
    texts = ["What causes the northern lights?", "Mitochondria generate most of the cell's chemical energy. " * 40]
    want = SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True,
                                                               normalize_embeddings=True)
    got = reference.embed(texts, 256)  # the long text truncated at 256 tokens as sentence-transformers does
    np.testing.assert_allclose((got * want).sum(1), 1.0, atol=1e-6)


def test_models_the_builder_does_not_know_are_exported_from_torch(tiny_bi_encoder, tiny_modernbert, tmp_path):
    assert direct.bert_spec(tiny_bi_encoder) is not None
    assert direct.bert_spec(tiny_modernbert) is None
    assert direct.bert_spec(_variant(tiny_bi_encoder, tmp_path / "a", position_embedding_type="relative_key")) is None
    assert direct.bert_spec(_variant(tiny_bi_encoder, tmp_path / "b", hidden_act="relu")) is None
    assert direct.bert_spec(_variant(tiny_bi_encoder, tmp_path / "c", pooling="max")) is None
    # a model it does not know: the openvino graph is torch's export, and it says so
    enc = BiEncoder(EncoderConfig(model=str(tiny_modernbert), backend="openvino"))
    (folder,) = (Path(os.environ["RETR_CACHE"]) / "onnx").iterdir()
    meta = json.loads((folder / "manifest.json").read_text())
    assert enc.backend == "openvino" and meta["source"] == "torch" and meta["checked_against"] == "torch"


def test_a_bert_graph_is_built_and_checked_without_torch(tiny_bi_encoder, tmp_path):
    """A first run with an empty cache imports neither torch, transformers nor sentence-transformers."""
    code = ("import sys\n"
            "from retr.retrieval.encoder import BiEncoder, EncoderConfig\n"
            f"enc = BiEncoder(EncoderConfig(model={str(tiny_bi_encoder)!r}, backend='openvino'))\n"
            "v = enc.encode(['solar panels', 'tea'])\n"
            "assert enc.backend == 'openvino' and v.shape == (2, 32), (enc.backend, v.shape)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules))\n")
    cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RETR_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    (folder,) = (cache / "onnx").iterdir()
    meta = json.loads((folder / "manifest.json").read_text())
    assert meta["source"] == "weights" and meta["checked_against"] == "a numpy forward pass of its weights"
    assert meta["check_cosine"] >= registry.BACKENDS["openvino"].floor(EMBEDDING)
    assert sorted(f.name for f in folder.iterdir()) == ["manifest.json", "model.bin", "model.xml"]


def test_a_built_graph_that_strays_from_its_weights_is_refused_and_the_refusal_remembered(tiny_bi_encoder, tmp_path):
    spec = direct.bert_spec(tiny_bi_encoder)
    weights = direct.load_weights(spec)
    # a builder that looked up the wrong words: the word embeddings' rows in reverse order
    wrong = {**weights, "embeddings.word_embeddings.weight": weights["embeddings.word_embeddings.weight"][::-1].copy()}
    builds = []

    def build_wrong(path):
        builds.append(path)
        return direct.Built(direct.build_graph(spec, wrong), direct.NumpyBert(spec, weights, path))

    kind = replace(EMBEDDING, build=build_wrong)
    enc_hash = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch")).model_hash
    for _ in range(2):  # the second time from the remembered refusal: nothing built
        with pytest.raises(RetrError, match=r"build of model .* disagrees with a numpy forward pass of its weights"):
            load_or_export(lambda: pytest.fail("torch is not asked"), enc_hash, registry.BACKENDS["openvino"], kind,
                           64, tmp_path / "c", model_path=tiny_bi_encoder)
    assert len(builds) == 1
    (folder,) = (tmp_path / "c" / "onnx").iterdir()
    assert [f.name for f in folder.iterdir()] == ["manifest.json"]


def test_a_build_that_fails_falls_back_to_torchs_export(tiny_bi_encoder, tmp_path, caplog):
    import logging

    def broken(_path):
        raise ValueError("an operation OpenVINO does not have")

    kind = replace(EMBEDDING, build=broken)
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))
    with caplog.at_level(logging.WARNING, logger="retr.retrieval.backends.graphs"):
        graph = load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["openvino"], kind,
                               enc.max_length, tmp_path / "c", model_path=tiny_bi_encoder)
    assert graph.check >= 0.999
    assert any("exporting it from torch" in r.getMessage() for r in caplog.records)
    (folder,) = (tmp_path / "c" / "onnx").iterdir()
    assert json.loads((folder / "manifest.json").read_text())["source"] == "torch"


def test_the_int8_benchmark_measures_every_graph_against_the_torch_model(tiny_bi_encoder):
    """The ranking noise benchmarks/int8_quality.py reports (retr.eval.graph_noise): each graph (the built bf16 one,
    the exported int8 ones) against the same torch reference; the built graph adds next to none, int8 more."""
    from retr.eval.graph_noise import graph_noise

    noise = graph_noise(str(tiny_bi_encoder))
    assert {"openvino (bf16)", "onnx-int8 (queries)", "openvino-int8 (documents)"} <= set(noise)
    assert 0.0 <= noise["openvino (bf16)"] < noise["openvino-int8 (documents)"]


@pytest.mark.parametrize("bf16", ["0", "1"])
def test_a_static_int8_graph_is_calibrated_from_the_built_graph_without_torch(tiny_bi_encoder, tmp_path, bf16):
    """Where int8 runs (forced here) a corpus that pays for a calibration gets the static int8 graph quantised from
    the graph built from the weights: still no torch, transformers or sentence-transformers, and the pooled vector
    before its normalisation is not quantised (export.STATIC_INT8_PROCEDURE 2). Checked against the base graph the
    encoder holds where that computes in fp32 (nothing built or compiled again), else against the built graph
    compiled in fp32."""
    code = ("import sys\n"
            "from retr.retrieval.encoder import BiEncoder, EncoderConfig\n"
            f"enc = BiEncoder(EncoderConfig(model={str(tiny_bi_encoder)!r}, backend='openvino-int8', "
            "calibration_min_docs=2))\n"
            f"e = enc.encode_corpus({TEXTS!r})\n"
            "assert e.graph['backend'] == 'openvino-int8' and e.embeddings.shape == (5, 32), e.graph\n"
            "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules))\n")
    cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RETR_CACHE": str(cache), "RETR_INT8_DOT": "1", "RETR_BF16": bf16})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    (folder,) = [f for f in (cache / "onnx").iterdir() if "int8" in f.name]
    meta = json.loads((folder / "manifest.json").read_text())
    # checked against the base graph or the built graph in fp32, each checked against the numpy pass (seconds, not
    # ~20 for the numpy pass itself)
    against = "the openvino graph it is made from, in fp32" if bf16 == "0" else "its graph built from the weights in fp32"
    assert meta["source"] == "weights" and meta["checked_against"].startswith(against)
    assert meta["check_cosine"] >= registry.BACKENDS["openvino-int8"].floor(EMBEDDING)
    import openvino as ov

    model = ov.Core().read_model(str(folder / "model.xml"))
    quantised_inputs = {t.get_node().get_type_name() for op in model.get_ops() if op.get_type_name() == "FakeQuantize"
                        for o in op.outputs() for t in o.get_target_inputs()}
    assert "MatMul" in quantised_inputs and "NormalizeL2" not in quantised_inputs
