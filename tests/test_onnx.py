"""The ONNX backend: equal to torch on padded mixed-length batches, and a bad export is caught."""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest

from retr.retrieval.backends import direct, registry
from retr.retrieval.backends.export import DYNAMIC_INT8, EMBEDDING, TorchEmbedding, verify_embedding
from retr.retrieval.backends.graphs import load_or_export
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError

DEFAULT = registry.DEFAULT_BACKEND


def _patch_backend(monkeypatch, name: str, **changes) -> None:
    """Replace one registry entry for the test (the registry is immutable: a new mapping)."""
    entries = dict(registry.BACKENDS)
    entries[name] = replace(entries[name], **changes)
    monkeypatch.setattr(registry, "BACKENDS", MappingProxyType(entries))


TEXTS = ["solar panels", "wolves hunt in packs and live in forests and tundra " * 3, "tea",
         "coffee beans are roasted ground and brewed with hot water", "x"]


def test_onnx_equals_torch_on_padded_mixed_batches(tiny_bi_encoder, tmp_path):
    torch_enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))
    onnx_enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx", token_budget=40))
    assert torch_enc.backend == "torch" and onnx_enc.backend == "onnx"
    ref = torch_enc.encode(TEXTS)
    got = onnx_enc.encode(TEXTS)  # a small token budget forces several length-sorted batches
    np.testing.assert_allclose((got * ref).sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    for i, t in enumerate(TEXTS):  # the single-query path agrees with the batched one
        np.testing.assert_allclose(onnx_enc.encode_query(t)[0], got[i], atol=1e-5)
    # exported once, then loaded from the cache with its manifest
    folders = list((tmp_path / "retr-cache" / "onnx").iterdir())
    assert len(folders) == 1 and (folders[0] / "manifest.json").is_file()


def test_an_exported_model_opens_finds_and_names_its_graphs(tiny_bi_encoder, tmp_path):
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"))
    held = enc.exported  # what opened the encoder's graph
    assert held.find("onnx").path == enc.graph.path  # made once, found in the cache since
    assert held.find("onnx-int8") is None and held.open("torch") is None  # find makes nothing; torch has no graph
    assert len(list((tmp_path / "retr-cache" / "onnx").iterdir())) == 1
    assert held.identity(enc.graph) == enc.graph.identity(enc.model_hash) and held.identity(None).key == "torch"



def test_without_onnxruntime_a_cached_openvino_graph_still_opens_and_nothing_new_is_exported(tiny_bi_encoder,
                                                                                              monkeypatch, caplog):
    """A cached OpenVINO graph needs no onnxruntime (a one-query search does not import it); where a graph would
    have to be exported (its checks need onnxruntime), the encoder takes torch with a warning."""
    import importlib.util
    import sys

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))  # made and cached
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime: ImportError
    assert enc.exported.open("openvino").path == enc.graph.path
    assert enc.exported.open("onnx") is None and "onnxruntime is not installed" in caplog.text

def _legacy_export(st_model, path):
    """A legacy (TorchScript) export traced on one unpadded input."""
    import torch

    hf = st_model[0].auto_model.eval()

    class Embed(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            h = self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).float()
            return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    ex = st_model.tokenizer(["solar panels make electricity"], return_tensors="pt")
    torch.onnx.export(Embed(hf).eval(), (ex["input_ids"], ex["attention_mask"]), str(path), dynamo=False,
                      input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
                      dynamic_axes={"input_ids": {0: "b", 1: "l"}, "attention_mask": {0: "b", 1: "l"}})


@pytest.mark.parametrize("variant", ["onnx", "openvino"])
def test_a_graph_that_ignores_padding_is_refused_and_the_refusal_remembered(tiny_bi_encoder, tmp_path, variant):
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))

    def wrong_export(st_model, path):
        # simulate a baked-in mask path: the graph ignores the mask input, so padding leaks into the mean
        _legacy_export(st_model, path)
        import onnx

        g = onnx.load(str(path))
        mask_input = g.graph.input[1].name
        ones = onnx.helper.make_node("Shape", [mask_input], ["_shape"])
        fill = onnx.helper.make_node("ConstantOfShape", ["_shape"], ["_ones"],
                                     value=onnx.helper.make_tensor("v", onnx.TensorProto.INT64, [1], [1]))
        for node in g.graph.node:
            node.input[:] = ["_ones" if i == mask_input else i for i in node.input]
        g.graph.node.insert(0, fill)
        g.graph.node.insert(0, ones)
        onnx.save(g, str(path))

    exports = []
    kind = replace(EMBEDDING, export=lambda *a: exports.append(1) or wrong_export(*a))
    for _ in range(2):  # the second time from the remembered refusal: no export
        with pytest.raises(RetrError, match=r"disagrees with torch \(cosine"):
            load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS[variant], kind, enc.max_length,
                           tmp_path / "c")
    assert len(exports) == 1
    (folder,) = (tmp_path / "c" / "onnx").iterdir()
    assert [f.name for f in folder.iterdir()] == ["manifest.json"]  # no graph file kept


def test_openvino_backend_is_close_to_torch_and_cached_as_ir(tiny_bi_encoder, tmp_path):
    torch_enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))
    ov_enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino", query_backend="openvino",
                                     token_budget=40))
    precision = ov_enc.describe()["precision"]
    assert ov_enc.backend == "openvino" and precision in ("bf16", "fp32") and ov_enc.graph.precision == precision
    ref = torch_enc.encode(TEXTS)
    got = ov_enc.encode(TEXTS)
    floor = 0.999 if precision == "bf16" else 0.9999
    assert (got * ref).sum(1).min() >= floor
    for i, t in enumerate(TEXTS):
        assert float(ov_enc.encode_query(t)[0] @ got[i]) >= floor
    (folder,) = (tmp_path / "retr-cache" / "onnx").iterdir()
    assert (folder / "model.xml").is_file() and (folder / "model.bin").is_file()
    assert not list(folder.glob("*.onnx*"))  # the intermediate ONNX graph is not kept
    manifest = (folder / "manifest.json").read_text()
    again = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))
    assert again.backend == "openvino" and (folder / "manifest.json").read_text() == manifest  # from the cache
    np.testing.assert_allclose(again.encode(TEXTS), got, atol=2e-2)


def test_an_export_torchscript_cannot_make_comes_from_dynamo_and_older_exports_are_redone(tiny_bi_encoder, tmp_path,
                                                                                         monkeypatch, caplog):
    import json
    import logging

    from retr.retrieval.backends import export, graphs

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))
    monkeypatch.setattr(graphs, "_exports", {})  # no fp32 graph left from another test in this process

    real, exporters = export._onnx_export, []

    def cannot_trace(*args, dynamo):
        exporters.append(dynamo)
        if not dynamo:
            raise RuntimeError("TorchScript cannot trace this model")
        real(*args, dynamo=dynamo)

    monkeypatch.setattr(export, "_onnx_export", cannot_trace)
    graph = load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, enc.max_length,
                           tmp_path / "c")
    assert graph.check >= 0.9999 and exporters == [False, True]  # dynamo's graph, verified as any other
    (folder,) = (tmp_path / "c" / "onnx").iterdir()
    meta = json.loads((folder / "manifest.json").read_text())
    assert meta["export_generation"] == graphs.EXPORT_GENERATION
    assert graphs.find_cached(enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, tmp_path / "c") is not None
    meta["export_generation"] = 1  # cached by an older export procedure: exported again, not used
    (folder / "manifest.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.INFO, logger="retr.retrieval.backends.graphs"):
        assert graphs.find_cached(enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, tmp_path / "c") is None
    assert not folder.exists()
    said = [r for r in caplog.records if "earlier procedure (generation 1" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said)  # an old graph is not a damaged one
    assert not any("damaged" in r.getMessage() for r in caplog.records)


def test_verify_scores_a_good_export_near_one(tiny_bi_encoder, tmp_path):
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="torch"))
    graph = load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, enc.max_length,
                           tmp_path / "c")
    assert graph.check >= 0.9999 and graph.dim == 32
    assert verify_embedding(graph.runner, TorchEmbedding(enc.model), enc.max_length) == pytest.approx(graph.check)


def test_unknown_backend_is_refused():
    with pytest.raises(RetrError, match="unknown bi-encoder backend 'tensorrt': choose one of openvino-int8"):
        EncoderConfig(backend="tensorrt")
    from retr.retrieval.rerank import RerankConfig

    with pytest.raises(RetrError, match="unknown cross-encoder backend 'tensorrt'"):
        RerankConfig(model="x", backend="tensorrt")


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_cross_encoder_graph_scores_like_torch(tiny_cross_encoder, backend):
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    ref_r = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), backend="torch", max_length=64))
    r = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), backend=backend, max_length=64,
                                          token_budget=40))  # several length-sorted batches
    assert ref_r.backend == "torch" and r.backend == backend and r.describe()["backend"] == backend
    ref = ref_r.score("wolves in forests", TEXTS)
    got = r.score("wolves in forests", TEXTS)
    tol = 1e-4 if backend == "onnx" else 0.02 * max(1.0, float(np.ptp(ref)))
    np.testing.assert_allclose(got, ref, atol=tol)
    np.testing.assert_allclose(r.score("wolves in forests", TEXTS[1:2]), ref[1:2], atol=tol)  # a single pair


def test_static_int8_cross_encoder_is_calibrated_on_pairs_and_checked_for_ranking_noise(tiny_cross_encoder,
                                                                                           monkeypatch):
    """The cross-encoder's static int8 graph: calibrated once per model on retr's sample of question-passage pairs
    (with their token types), refused when its ranking noise is over the bar, kept with its noise recorded when
    it is not."""
    from retr.retrieval.backends.export import Calibration, score_noise
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    cfg = RerankConfig(model=str(tiny_cross_encoder), backend="openvino-int8", max_length=64)
    _patch_backend(monkeypatch, "openvino-int8", max_rank_noise={"ce": 0.0})  # any int8 graph adds some noise
    with pytest.raises(RetrError, match="openvino-int8 graph of model .* adds ranking noise"):
        CrossEncoderReranker(cfg)
    # a random tiny model's scores barely spread over the sample, so its noise ratio is large: a looser bar
    _patch_backend(monkeypatch, "openvino-int8", max_rank_noise={"ce": 1e9})
    r = CrossEncoderReranker(cfg)
    cal = r._calibration()
    assert cal.types is not None and len(cal.types) == len(cal.rows) > 0
    assert any(1 in t for t in cal.types)  # the passages' token types, as the pairs are scored
    assert set(next(cal.feeds())) == {"input_ids", "attention_mask", "token_type_ids"}
    assert Calibration.of(cal.rows).digest != cal.digest  # the token types name the graph too
    info = r.graph.info()
    assert r.backend == "openvino-int8" and info["calibration"] == cal.digest
    assert info["rank_noise"] == pytest.approx(score_noise(r.graph.runner, r.model, 64), rel=1e-4)
    assert r.score("wolves in forests", TEXTS).shape == (len(TEXTS),)


def test_fast_pair_tokenizer_equals_transformers_truncation():
    from transformers import AutoTokenizer

    from retr.retrieval.backends.batching import fast_pair_tokenizer
    from retr.retrieval.models import bundled_model_path

    path = bundled_model_path()
    pair_ids = fast_pair_tokenizer(path, 24)
    hf = AutoTokenizer.from_pretrained(str(path))
    query = "do wolves hunt in packs in the northern forests"
    ids, types = pair_ids(query, TEXTS)
    want = hf([(query, t) for t in TEXTS], truncation=True, max_length=24, return_token_type_ids=True)
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    assert max(map(len, ids)) == 24  # the long pair was truncated


def test_a_corpus_is_tokenised_in_chunks_on_one_thread_per_core_in_order(monkeypatch):
    """Several chunks: tokenised on ``platform.thread_count`` threads (the tokenizer lets go of Python's lock), the
    ids and untruncated counts in the texts' order, the same as one chunk on one thread gives."""
    import threading
    import time

    from retr.retrieval.backends import batching
    from retr.retrieval.models import bundled_model_path

    texts = [f"{t} {i}" * (1 + i % 7) for i, t in enumerate(TEXTS * 12)]
    fast = batching.fast_tokenizer(bundled_model_path(), 24)
    one_ids, one_counts = fast.counted(texts)  # 60 texts: one chunk
    assert [len(r) for r in one_ids] == [min(24, n) for n in one_counts] and max(one_counts) > 24
    names, encode = set(), fast._encode
    # each chunk held a little: every chunk is handed out while the threads are busy (none idle to take two)
    fast._encode = lambda chunk: names.add(threading.current_thread().name) or time.sleep(0.05) or encode(chunk)
    monkeypatch.setattr(batching, "TOKENIZE_CHUNK", 7)
    monkeypatch.setattr("retr.retrieval.backends.platform.thread_count", lambda cores=None: 2)
    ids, counts = fast.counted(texts)
    assert [r.tolist() for r in ids] == [r.tolist() for r in one_ids] and counts.tolist() == one_counts.tolist()
    assert [r.tolist() for r in fast(texts)] == [r.tolist() for r in one_ids]
    assert len(names) == 2 and all(n.startswith("retr-tokenize") for n in names)


@pytest.mark.parametrize("n,chunks", [(15, 1), (16, 2), (40, 2)])
def test_a_short_list_is_cut_across_the_threads_only_where_each_keeps_its_least(monkeypatch, n, chunks):
    """A query's pairs or a few documents' sentences (under one ``TOKENIZE_CHUNK``): cut into a chunk a thread where
    each keeps ``least`` texts, else tokenised on the calling thread; the results in order either way."""
    from retr.retrieval.backends import batching

    monkeypatch.setattr("retr.retrieval.backends.platform.thread_count", lambda cores=None: 2)
    seen = []
    out = batching.in_chunks(lambda part: seen.append(len(part)) or [x * 2 for x in part], list(range(n)), 8)
    assert out == [2 * x for x in range(n)] and len(seen) == chunks and sum(seen) == n


def test_ids_only_encoding_gives_the_full_encodings_ids_and_falls_back_without_it():
    from retr.retrieval.backends.batching import _fast_tokenizer_file, ids_only
    from retr.retrieval.models import bundled_model_path

    tok = _fast_tokenizer_file(bundled_model_path(), 24)
    assert ids_only(tok) == tok.encode_batch_fast
    pairs = [("do wolves hunt in packs", t) for t in TEXTS]
    for items in (TEXTS, pairs):
        fast, full = ids_only(tok)(items), tok.encode_batch(items)
        assert [(e.ids, e.type_ids) for e in fast] == [(e.ids, e.type_ids) for e in full]

    class Older:  # a tokenizers release without the offsets-free batch encoding
        encode_batch = tok.encode_batch

    assert ids_only(Older()) == tok.encode_batch


def test_queries_share_the_document_graph_unless_another_query_backend_is_chosen(tiny_bi_encoder, tmp_path):
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))
    docs = enc.encode(TEXTS)
    # the default: the documents' graph, or the same model compiled as one stream where that was timed faster
    np.testing.assert_allclose(enc.encode_queries(TEXTS), docs, atol=1e-6)
    assert enc.query_graph.path == enc.graph.path and enc.query_graph.runner._model is enc.graph.runner._model
    assert enc.describe_queries()["backend"] == "openvino"
    int8 = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino", query_backend="onnx-int8"))
    q = int8.encode_queries(TEXTS)
    info = int8.describe_queries()
    assert info["backend"] == "onnx-int8" and info["precision"] == DYNAMIC_INT8
    assert info["check_cosine"] >= 0.985
    assert (q * docs).sum(1).min() >= 0.98  # int8 queries against bf16/fp32 documents: the same space
    assert not np.array_equal(q, docs)  # really another graph
    for i, t in enumerate(TEXTS):  # a query's vector does not depend on the queries encoded with it
        np.testing.assert_array_equal(int8.encode_query(t)[0], q[i])
        np.testing.assert_array_equal(int8.encode_queries([TEXTS[0], t])[1], q[i])
    names = sorted(f.name.split("-", 1)[1] for f in (tmp_path / "retr-cache" / "onnx").iterdir())
    assert names == ["onnx-int8", "openvino"]


def test_concurrent_single_calls_run_on_their_own_requests_and_agree(tiny_bi_encoder):
    from concurrent.futures import ThreadPoolExecutor

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))
    runner = enc.query_graph.runner  # the documents' graph, or the same model as one stream (timed faster)
    alone = [enc.encode_query(t) for t in TEXTS * 4]
    with ThreadPoolExecutor(4) as pool:  # more callers than streams: they wait for a request, never share one
        together = list(pool.map(enc.encode_query, TEXTS * 4))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)
    assert 1 <= runner._made <= runner.parallel  # never more requests than streams
    np.testing.assert_allclose(np.vstack(alone[:len(TEXTS)]), enc.encode(TEXTS), atol=1e-6)  # batches: same graph


def test_a_single_call_made_while_another_is_on_the_one_stream_takes_the_documents_streams(tiny_bi_encoder,
                                                                                          monkeypatch):
    import threading

    from retr.retrieval.backends import runners
    from retr.retrieval.backends.runners import OpenVinoRunner

    clock = [1000.0]
    monkeypatch.setattr(runners.time, "monotonic", lambda: clock[0])

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))
    streams = OpenVinoRunner(enc.graph.path, 2, enc.graph.precision)  # two streams, as on a 2-core machine
    one = streams.one_stream()
    assert one.parallel == 1 and streams.parallel == 2
    ids = np.asarray(enc.tokens.ids(["what causes the northern lights"]), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    alone = one(feeds)
    overflowed = []
    real_streams_call = streams.__call__
    one._overflow = lambda f: overflowed.append(1) or real_streams_call(f)
    started, release, first = threading.Event(), threading.Event(), []
    real_infer = one._infer

    def held(f):  # the first call stays in flight until the second one has returned
        started.set()
        assert release.wait(30)
        return real_infer(f)

    one._infer = held
    worker = threading.Thread(target=lambda: first.append(one(feeds)))
    worker.start()
    assert started.wait(30)
    second = one(feeds)  # made while the first is in flight: the streams, not a wait for the one request
    release.set()
    worker.join(30)
    one._infer = real_infer
    assert overflowed == [1] and one._active == 0
    clock[0] += runners.OVERFLOW_HOLD_S / 2
    third = one(feeds)  # nothing in flight, but soon after an overflow: still the streams (a loaded server's gap)
    assert overflowed == [1, 1]
    clock[0] += runners.OVERFLOW_HOLD_S / 2 + 1e-3
    fourth = one(feeds)  # the hold ran out (a call made alone did not extend it): the one stream again
    fifth = one(feeds)
    assert overflowed == [1, 1]
    for got in (first[0], second, third, fourth, fifth):  # the same file in the same precision: the same vector
        np.testing.assert_allclose(got, alone, atol=1e-5)


def test_a_refused_query_graph_falls_back_to_the_document_graph(tiny_bi_encoder, monkeypatch):
    _patch_backend(monkeypatch, "onnx-int8", floors={"bi": 1.01})  # no int8 graph can pass this floor
    assert EncoderConfig(backend="onnx").resolved_query_backend == "onnx"  # explicit fp32 stays fp32 for queries
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx", query_backend="onnx-int8"))
    np.testing.assert_allclose(enc.encode_queries(TEXTS), enc.encode(TEXTS), atol=1e-6)
    assert enc.describe_queries()["backend"] == "onnx"


def _int8_folders(tmp_path):
    return [f for f in (tmp_path / "retr-cache" / "onnx").iterdir() if "openvino-int8" in f.name]


def _counting_static_int8(monkeypatch, **changes) -> list:
    """Count the default backend's calibrations (the default documents' backend is a calibrated one)."""
    convert = registry.BACKENDS[DEFAULT].convert
    calls = []
    _patch_backend(monkeypatch, DEFAULT, convert=lambda *a, **k: calls.append(1) or convert(*a, **k), **changes)
    return calls


def test_corpora_go_through_one_static_int8_graph_calibrated_once_per_model(tiny_bi_encoder, tmp_path,
                                                                              monkeypatch):
    import json

    calls = _counting_static_int8(monkeypatch)
    words = " ".join(TEXTS).split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 11)) for i in range(40)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))  # default backend
    assert enc.backend == DEFAULT and enc.describe()["backend"] == DEFAULT
    small = enc.encode_corpus(corpus[:10])  # under calibration_min_docs: the openvino graph, as encode()
    assert small.graph["backend"] == "openvino" and calls == []
    np.testing.assert_array_equal(small.embeddings, enc.encode(corpus[:10]))
    encoded = enc.encode_corpus(corpus)
    emb, info = encoded.embeddings, encoded.graph
    assert info["backend"] == DEFAULT and info["precision"].startswith("int8+")
    assert info["check_cosine"] >= 0.98 and calls == [1]
    plain = enc.encode(corpus)  # any other text: the openvino graph
    cos = (emb * plain).sum(1)
    assert cos.min() >= 0.97 and not np.array_equal(emb, plain)  # close, and really another graph
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-3)
    (int8,) = _int8_folders(tmp_path)
    meta = json.loads((int8 / "manifest.json").read_text())
    digest = enc.planner.calibration.digest
    assert meta["calibration"] == digest and int8.name.endswith(digest[:16])
    assert 0.0 < meta["rank_noise"] <= registry.MAX_RANK_NOISE and info["rank_noise"] == meta["rank_noise"]
    other = [t + " tea" for t in corpus[::-1]]  # another corpus, in another process: no calibration, same graph
    again = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert again.planner.calibration == enc.planner.calibration
    np.testing.assert_array_equal(again.encode_corpus(corpus).embeddings, emb)  # the cached graph, the same vectors
    assert again.encode_corpus(other).graph == info and calls == [1] and len(_int8_folders(tmp_path)) == 1
    # queries take the calibrated graph only where it is measured fastest (a query candidate: test_platform);
    # here the base graph is (fake timings), and they go through it as encode() does
    from retr.retrieval.query_graphs import QueryGraphs

    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: 0.001 if g.variant == "openvino" else 0.002)
    q = again.encode_queries(corpus[:3])
    assert again.describe_queries()["backend"] == "openvino" and (q * emb[:3]).sum(1).min() >= 0.95
    np.testing.assert_array_equal(q, again.encode(corpus[:3]))
    prompted = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), doc_prompt="passage: "))
    # the graph sees what the documents will look like
    assert prompted.planner.calibration.digest != enc.planner.calibration.digest


def test_without_int8_dot_products_corpora_and_pairs_take_the_base_graph_and_nothing_is_calibrated(
        tiny_bi_encoder, tiny_cross_encoder, tmp_path, monkeypatch):
    """On a CPU where int8 is no faster than the base graph (no int8 dot products; or AMX), the static int8
    backends hand their work to their base graph: the same vectors and scores as it, no calibration and no int8
    graph in the cache."""
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    monkeypatch.setenv("RETR_INT8_DOT", "0")
    assert not this_platform().static_int8
    calls = _counting_static_int8(monkeypatch)
    words = " ".join(TEXTS).split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 11)) for i in range(40)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert enc.backend == DEFAULT
    encoded = enc.encode_corpus(corpus)
    assert encoded.graph["backend"] == "openvino" and calls == []
    np.testing.assert_array_equal(encoded.embeddings, enc.encode(corpus))
    base_id = enc.planner.graph_id(corpus)  # embedding cache keys name the graph the corpus really went through
    assert base_id.startswith("openvino/") and calls == []
    other = "0" if enc.graph.precision == "bf16" else "1"  # the same graph computing in the other precision
    monkeypatch.setenv("RETR_BF16", other)
    assert BiEncoder(EncoderConfig(model=str(tiny_bi_encoder))).planner.graph_id(corpus) not in ("", base_id)
    monkeypatch.delenv("RETR_BF16")
    r = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), backend="openvino-int8", max_length=64))
    base = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), backend="openvino", max_length=64))
    assert r.backend == "openvino" and calls == []
    np.testing.assert_array_equal(r.score("wolves in forests", TEXTS), base.score("wolves in forests", TEXTS))
    assert _int8_folders(tmp_path) == []
    assert enc.calibrated_graph is None and calls == []  # asked for directly: none here either
    monkeypatch.setenv("RETR_INT8_DOT", "1")  # a CPU with them: the int8 graph, calibrated
    on_vnni = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert on_vnni.encode_corpus(corpus).graph["backend"] == DEFAULT and calls == [1]
    assert on_vnni.planner.graph_id(corpus) != base_id
    assert on_vnni.planner.graph_id(corpus).startswith(f"{DEFAULT}@")


def test_where_int8_runs_a_corpus_the_base_graph_encodes_is_keyed_by_the_base_graph(tiny_bi_encoder, monkeypatch):
    """Issue 39: on a CPU where int8 runs, a corpus under calibration_min_docs, or one the measured break says does
    not pay for a calibration, goes through the base graph, and its cache keys name that graph, not the int8 one;
    the break is timed once per corpus size, for the key and the plan alike."""
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    calls = _counting_static_int8(monkeypatch)
    _patch_backend(monkeypatch, DEFAULT, uncalibrated=None)  # the base graph against static int8 alone (below)
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert enc.planner.platform.static_int8  # int8 runs here (RETR_INT8_DOT=1)
    base_id = enc.exported.identity(enc.graph).key
    assert base_id.startswith("openvino/")
    small = enc.encode_corpus(corpus[:10])  # under calibration_min_docs: the base graph, and named so
    assert small.graph["backend"] == "openvino" and enc.planner.graph_id(corpus[:10]) == base_id
    assert enc.planner.graph_id(corpus).startswith(f"{DEFAULT}@") and calls == []  # naming calibrates nothing
    timed = []
    speeds = {"openvino": 0.02, "openvino-int8": 0.01}
    monkeypatch.setattr(DocumentSpeeds, "doc_seconds",
                        lambda self, g, tokens: timed.append(g.variant) or speeds[g.variant])
    measured = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    measured.__dict__["platform"] = Platform.of({"avx2", "avx512f", "avx512_vnni"})  # int8 dot products, not forced
    assert measured.planner.graph_id(corpus) == base_id  # keyed before encoding, as a build does
    encoded = measured.encode_corpus(corpus)  # 40 documents save far less than the assumed calibration costs
    assert encoded.graph["backend"] == "openvino" and encoded.graph["chosen"]["pays"] is False
    assert timed == ["openvino"] and calls == []


def test_a_corpus_too_small_for_a_calibration_goes_through_the_int8_weights_graph_where_measured_faster(
        tiny_bi_encoder, monkeypatch):
    """Issue 39: where int8 runs and the int8 graph made without calibration (``openvino-int8w``) is measured more
    than the margin faster than the base graph, a corpus whose calibration would not pay goes through it: keyed by
    it before encoding, nothing calibrated, documents added later through it again. Measured no faster (another
    CPU): the base graph. A corpus for which static int8 clearly pays never makes or times it."""
    from retr.retrieval import corpus_weighing
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph on every CPU, as on the platform below
    # weighing the int8-weights graph as if it cost nothing: a tiny corpus would not repay its real cost (tested
    # apart: test_an_int8_weights_graph_is_made_only_where_it_could_repay_making_and_timing_it)
    monkeypatch.setattr(corpus_weighing, "WEIGHTS_MAKE_S", 0.0)
    monkeypatch.setattr(corpus_weighing, "WEIGHTS_TIME_S", 0.0)
    calls = _counting_static_int8(monkeypatch)
    timed = []
    speeds = {"openvino": 0.02, "openvino-int8w": 0.01}  # seconds per token (fake)
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: timed.append(g.variant) or speeds[g.variant])
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    vnni = Platform.of({"avx2", "avx512f", "avx512_vnni"})  # int8 dot products, not forced; fp32 base graph
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = vnni
    with monkeypatch.context() as m:  # made from the base graph and checked on its streams: nothing built again
        assert enc.graph.variant == "openvino"  # the base graph, built from the weights first
        m.setattr(direct, "load_weights", lambda *a: pytest.fail("the graph was built again"))
        m.setattr(direct.CompiledReference, "__init__", lambda *a: pytest.fail("a reference was compiled"))
        assert enc.planner.graph_id(corpus).startswith("openvino-int8w/")  # keyed before encoding, as a build does
    made = json.loads((enc.planner.weights_graph.path.parent / "manifest.json").read_text())
    assert made["checked_against"].startswith("the openvino graph it is made from")
    encoded = enc.encode_corpus(corpus)
    chosen = encoded.graph["chosen"]
    assert encoded.graph["backend"] == "openvino-int8w" and chosen["against"] == "openvino-int8w"
    assert enc.graph.runner._compiled is None  # the base graph, the checks' reference, dropped before encoding
    assert chosen["pays"] is False and chosen["base_graph_s"] == pytest.approx(2 * chosen["base_s"])
    assert calls == [] and timed == ["openvino", "openvino-int8w"]  # once for the key and the encoding alike
    base = enc.encode(corpus)
    cosine = (encoded.embeddings * base).sum(axis=1)
    assert cosine.min() > 0.99 and not np.array_equal(encoded.embeddings, base)  # int8: close, not the same
    np.testing.assert_allclose(enc.encode_like(corpus[:3], encoded.graph), encoded.embeddings[:3], atol=1e-5)
    timed.clear()
    again = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    again.__dict__["platform"] = vnni
    other_corpus = [f"note {i} on rivers" for i in range(45)]
    assert again.encode_corpus(other_corpus).graph["backend"] == "openvino-int8w" and timed == []  # stored

    # within the margin: not worth its ranking noise; both 4x faster than above, so that static int8 (assumed 2.03x)
    # saves this corpus ~1 s, under its assumed cost (CALIBRATION_PRIOR_S)
    speeds.update({"openvino": 0.005, "openvino-int8w": 0.00475})
    other = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    other.__dict__["platform"] = Platform.of(vnni.flags, cpu="another CPU")  # not the stored timings
    assert other.planner.graph_id(corpus) == other.exported.identity(other.graph).key
    assert other.encode_corpus(corpus).graph["backend"] == "openvino" and calls == []

    timed.clear()
    speeds["openvino"] = 2.0  # static int8 (assumed 2.03x) saves far more than its assumed cost here
    large = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    large.__dict__["platform"] = Platform.of(vnni.flags, cpu="a third CPU")
    assert large.encode_corpus(corpus).graph["backend"] == DEFAULT and len(calls) == 1
    assert timed == ["openvino"] and "weights_graph" not in large.planner.__dict__  # neither made nor timed


def test_an_int8_weights_graph_checked_on_its_base_graph_scores_as_against_a_reference_built_again(
        tiny_bi_encoder, monkeypatch, tmp_path):
    """The int8-weights graph made from the base graph the encoder holds and checked on its streams gets the
    checks' figures it gets against the graph built again from the weights and compiled apart (what was done
    before): the same cosine and ranking noise, and the base graph's file is left as it was."""
    monkeypatch.setenv("RETR_BF16", "0")  # the base graph in fp32: what a reference must compute in
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    base_file = enc.graph.path.read_bytes()
    backend = registry.BACKENDS["openvino-int8w"]
    on_base = load_or_export(lambda: enc.model, enc.model_hash, backend, EMBEDDING, enc.max_length, tmp_path / "a",
                             model_path=enc.ref.path, base=enc.graph)
    apart = load_or_export(lambda: enc.model, enc.model_hash, backend, EMBEDDING, enc.max_length, tmp_path / "b",
                           model_path=enc.ref.path)
    assert on_base.check == pytest.approx(apart.check, abs=2e-5)
    assert on_base.rank_noise == pytest.approx(apart.rank_noise, rel=0.02, abs=1e-5)
    assert enc.graph.path.read_bytes() == base_file
    meta = [json.loads((g.path.parent / "manifest.json").read_text()) for g in (on_base, apart)]
    assert meta[0]["checked_against"].startswith("the openvino graph it is made from")
    assert meta[1]["checked_against"].startswith("its graph built from the weights in fp32")


def test_an_int8_graphs_checks_read_the_sample_vectors_the_planner_timed_the_base_graph_on(tiny_bi_encoder,
                                                                                           monkeypatch, tmp_path):
    """Once the planner has timed the base graph on retr's sample passages, an int8 graph made from it takes those
    vectors as its checks' reference: the base graph does not run the passages again, and the checks' figures
    are those of a reference that did."""
    from retr.retrieval.backends import direct, sample_texts

    monkeypatch.setenv("RETR_BF16", "0")  # the base graph in fp32: what a reference must compute in
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    backend = registry.BACKENDS["openvino-int8w"]

    def made(folder):
        return load_or_export(lambda: enc.model, enc.model_hash, backend, EMBEDDING, enc.max_length, folder,
                              model_path=enc.ref.path, base=enc.graph)

    fresh = made(tmp_path / "a")  # nothing timed yet: the reference runs the passages
    enc.planner.speeds.token_seconds(enc.graph)
    assert enc.graph.known
    ran, real = [], direct.embed_in_batches
    monkeypatch.setattr(direct, "embed_in_batches",
                        lambda runner, feed, texts, *a, **k: ran.append(len(texts)) or real(runner, feed, texts, *a,
                                                                                            **k))
    reused = made(tmp_path / "b")
    assert len(sample_texts.passages() + sample_texts.long_passages()) not in ran and ran  # questions still run
    assert reused.rank_noise == pytest.approx(fresh.rank_noise, rel=1e-3, abs=1e-6)
    assert reused.check == pytest.approx(fresh.check, abs=1e-6)


@pytest.mark.parametrize("weighing_costs", [True, False])
def test_a_calibration_that_pays_once_weighing_the_int8_weights_graph_is_counted_never_makes_that_graph(
        tiny_bi_encoder, monkeypatch, weighing_costs):
    """Static int8 assumed at the platform's prior against an int8-weights graph assumed
    ``Platform.weights_prior`` times the base graph: for a corpus whose saving over that graph is under the
    calibration's cost but over what is left of it once the cost of making and timing that graph is counted on its
    side, the calibration is chosen and the int8-weights graph never made; where weighing it would cost nothing
    (made and timed already) it is made."""
    import math

    from retr.retrieval.backends.cost import prior
    CALIBRATION_PRIOR_S = prior("calibration_s")
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds
    from retr.retrieval.corpus_weighing import WEIGHTS_MAKE_S, WEIGHTS_TIME_S, Weighing

    platform = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu="VNNI, fp32 base graph")
    WEIGHTS_PRIOR = platform.weights_prior
    monkeypatch.setattr(DocumentSpeeds, "token_seconds",
                        lambda self, g: {"openvino": 1e-4, "openvino-int8w": 1e-4 / WEIGHTS_PRIOR}[g.variant])
    if not weighing_costs:
        monkeypatch.setattr(Weighing, "weights_cost_s", lambda self: 0.0)
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = platform
    tokens_per_doc = 100
    base_s = 1e-4 * tokens_per_doc
    saving = base_s / WEIGHTS_PRIOR - base_s / platform.int8_prior  # a document, static int8 against int8 weights
    weighing = WEIGHTS_MAKE_S + WEIGHTS_TIME_S
    # an int8-weights graph would repay weighing it twice over; static int8 pays against the base graph, and
    # against the int8-weights graph only once weighing that is counted
    docs = math.ceil(2 * weighing / (base_s * (1 - 1 / WEIGHTS_PRIOR)))
    assert docs * (base_s - base_s / platform.int8_prior) > CALIBRATION_PRIOR_S
    assert docs * saving < CALIBRATION_PRIOR_S  # before, this corpus made and timed the int8-weights graph
    assert docs * saving > CALIBRATION_PRIOR_S - weighing
    brk = enc.planner.weighing.calibration_break(docs, docs * tokens_per_doc)
    made = "weights_graph" in enc.planner.__dict__
    assert made is not weighing_costs
    if weighing_costs:
        assert brk.pays and brk.against_base


@pytest.mark.parametrize("bf16,tokens_per_doc,made", [(False, 5, False), (False, 25, True), (True, 100, False)])
def test_an_int8_weights_graph_is_made_only_where_it_could_repay_making_and_timing_it(
        tiny_bi_encoder, monkeypatch, caplog, bf16, tokens_per_doc, made):
    """2,000 documents, the base graph at 0.1 ms a token (fake), weighing the int8-weights graph costing 1 s (as
    where it is cached: timed only), the graph running at the platform's ``weights_prior``. An fp32 base graph
    (int8 weights assumed 1.7x): of 5 tokens each it would save ~0.4 s, under that second, so it is neither made
    nor timed; of 25 tokens, ~2 s, and static int8 would not repay its calibration: it is made and weighed. A bf16
    base graph (int8 weights computing in fp32, assumed 1.1x; an AVX-512 BF16 EPYC measured 1.06x on SciFact):
    of 100 tokens static int8 clearly pays, so the int8-weights graph is never made (it was, with one prior for
    both precisions, and encoded where static int8 was 1.4x faster)."""
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds
    from retr.retrieval.corpus_weighing import Weighing

    platform = Platform.of({"avx2", "avx512f", "avx512_vnni", *(["avx512_bf16"] if bf16 else [])}, cpu="VNNI")
    assert platform.bf16 is bf16 and platform.int8_prior > platform.weights_prior > 1
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: {
        "openvino": 1e-4, "openvino-int8w": 1e-4 / platform.weights_prior}[g.variant])
    monkeypatch.setattr(Weighing, "weights_cost_s", lambda self: 1.0)
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = platform
    docs = 2000
    saving = docs * 1e-4 * tokens_per_doc * (1 - 1 / platform.weights_prior)
    assert (saving > 1.0) is (made or bf16)
    with caplog.at_level("INFO"):
        brk = enc.planner.weighing.calibration_break(docs, docs * tokens_per_doc)
    assert ("weights_graph" in enc.planner.__dict__) is made
    assert brk.against == ("openvino-int8w" if made else "base")
    assert brk.pays is bf16
    assert ("openvino-int8w not made, it would save" in caplog.text) is not (made or bf16)


@pytest.mark.parametrize("docs,timed", [(20000, False), (3800, True)])
def test_the_base_graph_is_not_timed_where_its_speed_from_the_precision_probe_clears_the_break_even_widely(
        tiny_bi_encoder, monkeypatch, docs, timed):
    """The base graph's seconds per document estimated from the model's multiply-adds at the probe's measured rate
    (a fake probe: 1e8 multiply-adds a second in fp32): where static int8, assumed at the platform's prior, would
    save more than ``ESTIMATE_MARGIN`` times its calibration's cost, it is weighed on the estimate and the base
    graph is not timed; nearer the break-even (or without a probe: ``Platform.of``) the base graph is timed."""
    from dataclasses import replace

    from retr.retrieval.backends.cost import prior
    CALIBRATION_PRIOR_S = prior("calibration_s")
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.backends.precision import PROBE_MACS, PrecisionTiming
    from retr.retrieval.corpus_speeds import DocumentSpeeds
    from retr.retrieval.corpus_weighing import ESTIMATE_MARGIN, Weighing

    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph, as on the platform below
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    vnni = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu="VNNI, probed")
    probe = PrecisionTiming(bf16_ms=2 * PROBE_MACS / 1e5, fp32_ms=PROBE_MACS / 1e5)  # 1e8 multiply-adds/s in fp32
    enc.__dict__["platform"] = replace(vnni, precision_probe=probe)
    tokens_per_doc = 20
    per_doc_s = tokens_per_doc * enc.planner.weighing.spec.macs_per_token(tokens_per_doc) / 1e8
    ran = []  # timed, the base graph runs at the estimate (static int8 then pays all the same)
    monkeypatch.setattr(DocumentSpeeds, "token_seconds",
                        lambda self, g: ran.append(g.variant) or per_doc_s / tokens_per_doc)
    monkeypatch.setattr(Weighing, "weights_cost_s", lambda self: 0.0)
    saving = docs * per_doc_s * (1 - 1 / vnni.int8_prior)
    assert (saving > ESTIMATE_MARGIN * CALIBRATION_PRIOR_S) is not timed and saving > CALIBRATION_PRIOR_S
    brk = enc.planner.weighing.calibration_break(docs, docs * tokens_per_doc)
    assert brk.pays and brk.base_estimated is not timed and ran[:1] == (["openvino"] if timed else [])
    if not timed:
        assert brk.base_s == pytest.approx(per_doc_s)
    # no probe (a CPU without native bf16 runs none): timed whatever the corpus
    ran.clear()
    bare = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    bare.__dict__["platform"] = Platform.of(vnni.flags, cpu="VNNI, not probed")  # nothing stored for it either
    assert not bare.planner.weighing.calibration_break(docs, docs * tokens_per_doc).base_estimated and ran[0] == "openvino"


def test_the_base_graphs_timing_is_warmed_up_on_a_few_short_passages_not_a_whole_round(tiny_bi_encoder,
                                                                                       monkeypatch):
    """Timing a graph on retr's sample passages, alone or alternating with another: compiled and warmed up on the
    shortest few (two a stream), then timed over the whole sample, whose vectors it keeps (``Graph.known``)."""
    from retr.retrieval import corpus_speeds
    from retr.retrieval.backends import sample_texts
    from retr.retrieval.backends.batching import row_key

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    sizes, real = [], corpus_speeds.run_sorted
    monkeypatch.setattr(corpus_speeds, "run_sorted",
                        lambda runner, rows, *a, **k: sizes.append(len(rows)) or real(runner, rows, *a, **k))
    enc.planner.speeds.token_seconds(enc.graph)
    rows = enc.planner.speeds.sample_rows()
    assert sizes[0] == corpus_speeds.WARM_UP_ROWS_PER_STREAM * enc.graph.runner.parallel < len(rows)
    assert len(sizes) >= 2 and set(sizes[1:]) == {len(rows)}
    passages = (sample_texts.passages() + sample_texts.long_passages())[:5]  # the tiny model has no prompt
    np.testing.assert_allclose(np.stack([enc.graph.known[row_key(r)] for r in rows[:5]]), enc.encode(passages),
                               atol=1e-5)
    # two graphs timed in alternation: each warmed up the same way, then whole rounds
    monkeypatch.setattr(corpus_speeds, "PER_TOKEN_BUDGET_S", 0.0)
    sizes.clear()
    enc.planner.speeds.tokens_seconds_alternating([enc.graph, enc.graph])
    assert sizes[:2] == [sizes[0], sizes[0]] and sizes[0] < len(rows)
    assert set(sizes[2:]) == {len(rows)} and len(sizes) == 2 + 2 * corpus_speeds.PER_TOKEN_MIN_ROUNDS


def test_a_static_int8_graphs_checks_read_the_vectors_its_statistics_pass_computed(tiny_bi_encoder, monkeypatch,
                                                                                   tmp_path):
    """The statistics pass runs the base graph in fp32 over retr's calibration sample (its passages and questions):
    the calibrated graph's checks read those vectors as their reference (the base graph does not run the passages
    or questions again), and get the figures of a reference that did."""
    from retr.retrieval.backends import direct, sample_texts
    from retr.retrieval.backends.export import CHECK_TEXTS

    monkeypatch.setenv("RETR_BF16", "0")  # the base graph in fp32: what a reference must compute in
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    calibration = enc.planner.calibration

    def made(folder, backend):
        return load_or_export(lambda: enc.model, enc.model_hash, backend, EMBEDDING, enc.max_length, folder,
                              calibration=calibration, model_path=enc.ref.path, base=enc.graph)

    ran, real = [], direct.embed_in_batches
    monkeypatch.setattr(direct, "embed_in_batches",
                        lambda runner, feed, texts, *a, **k: ran.append((runner, len(texts))) or real(
                            runner, feed, texts, *a, **k))
    passages, questions = len(sample_texts.passages() + sample_texts.long_passages()), len(sample_texts.questions())
    first = made(tmp_path / "a", registry.BACKENDS[DEFAULT])
    base_runs = [n for runner, n in ran if runner is enc.graph.runner]
    assert passages not in base_runs and questions not in base_runs
    check_rows = {tuple(int(x) for x in r) for r in enc.tokens.ids(list(CHECK_TEXTS))}  # kept before the pass
    assert len(enc.graph.known) == len(set(calibration.rows) | check_rows)
    # the same graph checked against a reference that runs every text through the base graph (nothing seen)
    enc.graph.known.clear()
    quantize = registry.BACKENDS[DEFAULT].convert
    blind = replace(registry.BACKENDS[DEFAULT], convert=lambda src, dst, cal, seen=None: quantize(src, dst, cal))
    ran.clear()
    second = made(tmp_path / "b", blind)
    assert {passages, questions} <= {n for runner, n in ran if runner is enc.graph.runner}
    assert second.check == pytest.approx(first.check, abs=1e-5)
    assert second.rank_noise == pytest.approx(first.rank_noise, rel=1e-3, abs=1e-5)


def test_a_static_int8_graph_built_from_the_weights_reads_its_statistics_pass_vectors_in_its_checks(
        tiny_bi_encoder, monkeypatch, tmp_path):
    """Where the base graph computes in bf16 (no reference itself), static int8 is quantised from the graph built
    from the weights and checked against that graph compiled in fp32: its ranking-noise check reads the vectors the
    statistics pass computed for retr's passages and questions instead of running each again one at a time (~1.5 s
    of a first run on an AVX-512 BF16 EPYC), and gets the figures of a reference that ran them; and that fp32
    reference is checked on the numpy pass's vectors the base graph's own check computed (~0.8 s more)."""
    from retr.retrieval.backends import direct, sample_texts
    from retr.retrieval.backends.export import CHECK_TEXTS

    monkeypatch.setenv("RETR_BF16", "1")  # a bf16 base graph: the int8 graph's reference is the built graph
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    assert enc.graph.precision == "bf16"
    calibration = enc.planner.calibration

    def made(folder, backend):
        return load_or_export(lambda: enc.model, enc.model_hash, backend, EMBEDDING, enc.max_length, folder,
                              calibration=calibration, model_path=enc.ref.path, base=enc.graph)

    ran, real = [], direct.CompiledReference.forward
    monkeypatch.setattr(direct.CompiledReference, "forward",
                        lambda self, input_ids, attention_mask: ran.append(input_ids.shape[0]) or real(
                            self, input_ids, attention_mask))
    numpy_ran, numpy_real = [], direct.NumpyBert.forward
    monkeypatch.setattr(direct.NumpyBert, "forward",
                        lambda self, input_ids, attention_mask: numpy_ran.append(1) or numpy_real(
                            self, input_ids, attention_mask))
    samples = len(sample_texts.passages() + sample_texts.long_passages() + sample_texts.questions())
    assert len(enc.graph.reference_known) == len(CHECK_TEXTS)  # the base graph's own check ran them
    first = made(tmp_path / "a", registry.BACKENDS[DEFAULT])
    assert not numpy_ran  # the fp32 reference checked on the numpy vectors the base graph's check computed
    assert "built from the weights in fp32" in first.path.parent.joinpath("manifest.json").read_text()
    seen_runs = len(ran)
    quantize = registry.BACKENDS[DEFAULT].convert
    blind = replace(registry.BACKENDS[DEFAULT], convert=lambda src, dst, cal, seen=None: quantize(src, dst, cal))
    ran.clear()
    second = made(tmp_path / "b", blind)
    # with them, only the checks' own texts ran: the agreement check's batch and three singles, then their vectors
    assert seen_runs <= 1 + 3 + len(CHECK_TEXTS)
    assert len(ran) - seen_runs >= 0.9 * samples  # without them, the sample's texts ran again
    assert second.check == pytest.approx(first.check, abs=1e-5)
    assert second.rank_noise == pytest.approx(first.rank_noise, rel=1e-3, abs=1e-5)


def test_a_cached_calibration_with_its_speeds_stored_names_a_corpus_graph_without_tokenising_it(tiny_bi_encoder,
                                                                                               monkeypatch):
    """Once the calibrated graph is cached and its speed against the base graph stored, the calibration costs
    nothing and the choice no longer depends on a corpus's token count: a build's cache key (``graph_id``) is named
    without tokenising the corpus, the same key the tokenising choice gives; where the int8 graph is not faster by
    the margin there, the base graph's."""
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph, as on the platform below
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    vnni = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu="VNNI, settled")
    speeds = {"openvino": 2.0, "openvino-int8": 0.5}  # seconds per token (fake): static int8 pays at once
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: speeds[g.variant])
    monkeypatch.setattr(DocumentSpeeds, "tokens_seconds_alternating",
                        lambda self, graphs: [speeds[g.variant] for g in graphs])

    def encoder():
        enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
        enc.__dict__["platform"] = vnni
        return enc

    assert encoder().encode_corpus(corpus).graph["backend"] == DEFAULT  # calibrated, its speed assumed
    timing = encoder()
    key = timing.planner.graph_id(corpus)  # the calibrated graph timed against the base graph, and stored
    assert key.startswith(f"{DEFAULT}@")
    settled = encoder()
    monkeypatch.setattr(settled.tokens, "counted", lambda texts: pytest.fail("the corpus was tokenised"))
    assert settled.planner.graph_id(corpus) == key
    speeds["openvino-int8"] = 1.95  # within the margin: another CPU's stored timings say the base graph
    other = encoder()
    other.__dict__["platform"] = Platform.of(vnni.flags, cpu="VNNI, settled slower")
    base_key = other.planner.graph_id(corpus)
    again = encoder()
    again.__dict__["platform"] = other.platform
    monkeypatch.setattr(again.tokens, "counted", lambda texts: pytest.fail("the corpus was tokenised"))
    assert again.planner.graph_id(corpus) == base_key == again.exported.identity(again.graph).key


@pytest.mark.parametrize("ratio, timed", [(4.0, False), (1.2, True)])
def test_a_corpus_encoded_through_static_int8_keeps_its_speed_and_a_later_corpus_times_neither_graph(
        ratio, timed, tiny_bi_encoder, monkeypatch, tmp_path):
    """A corpus's encoding through the calibrated graph measures that graph: kept with the base graph's speed as
    the run weighed it (``record_encoding``), a later corpus reads the pair instead of timing both graphs in
    alternation, where int8 was faster by more than ``OBSERVED_CLEAR_RATIO``; closer than that, it times them. An
    estimated base speed stays marked estimated in the later corpus's break."""
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import OBSERVED_CLEAR_RATIO, DocumentSpeeds
    from retr.retrieval.corpus_weighing import Weighing
    from retr.retrieval.tokens import prefixed

    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph, as on the platform below
    vnni = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu=f"VNNI, observed at {ratio}")
    base_t = 1.0  # seconds per token, the base graph (fake): static int8 pays at once at the platform's prior
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: base_t)
    monkeypatch.setattr(Weighing, "weights_cost_s", lambda self: 0.0)
    alternated = []
    monkeypatch.setattr(DocumentSpeeds, "tokens_seconds_alternating",
                        lambda self, graphs: alternated.append(len(graphs)) or [base_t, base_t / ratio])

    def encoder(platform=vnni):
        enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
        enc.__dict__["platform"] = platform
        return enc

    first = encoder()
    plan = first.corpus_plan([f"{w} {i}" for i, w in enumerate(TEXTS * 8)])
    assert plan.graph is first.calibrated_graph and plan.choice["pays"] and not alternated
    tokens = sum(len(r) for r in plan.tokens)
    first.planner.speeds.record_encoding(replace(plan, choice={**plan.choice, "base_estimated": True}),
                                  tokens * base_t / ratio)  # int8 ``ratio`` times the base graph's speed
    later = encoder()
    other = [f"{w} {w} {i}" for i, w in enumerate(TEXTS * 9)]
    encoded = later.encode_corpus(other)
    assert encoded.graph["backend"] == DEFAULT and bool(alternated) is timed and (ratio >= OBSERVED_CLEAR_RATIO) is not timed
    brk = encoded.graph["chosen"]
    per_doc = sum(len(r) for r in later.planner._tokens(prefixed(later.prompts.document, other))[0]) / len(other)
    assert brk["base_s"] == pytest.approx(base_t * per_doc) and brk["int8_s"] == pytest.approx(base_t / ratio * per_doc)
    assert brk["base_estimated"] is not timed  # the stored pair's base was estimated; timed again: it is not
    # ``encode_corpus`` keeps what its own encoding measured, where it calibrated the graph (an empty cache)
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "empty"))
    alternated.clear()
    fresh = encoder()
    fresh.encode_corpus(other)
    assert not alternated
    kept = fresh.planner.speeds.stored_per_token(fresh.calibrated_graph)
    assert kept is not None and kept.observed and kept.base == pytest.approx(base_t) and kept.int8 < base_t


def test_where_no_corpus_could_pay_for_a_calibration_its_graph_is_named_without_counting_tokens(tiny_bi_encoder,
                                                                                                 monkeypatch, caplog):
    """With AMX (static int8 assumed no faster than the base graph) and nothing calibrated yet, no corpus could pay
    for a calibration: a build names its graph (``graph_id``) and plans it without counting the corpus's tokens for
    a break (SciFact: ~1 s of a `retr eval` whose index is cached), says so once, and records the unweighed choice
    as before; once static int8 is calibrated here (``retr doctor --export``), it is weighed again."""
    import logging

    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.tokens import prefixed

    amx = Platform.of({"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"}, cpu="AMX, uncalibrated",
                      bf16_forced=False)
    assert amx.int8_prior <= 1
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = amx
    assert enc.planner.size_matters
    counted, real = [], enc.tokens.counted
    monkeypatch.setattr(enc.tokens, "counted", lambda texts: counted.append(len(texts)) or real(texts))
    with caplog.at_level(logging.INFO, logger="retr.retrieval.corpus_plan"):
        assert enc.planner.graph_id(corpus) == enc.exported.identity(enc.graph).key and counted == []
        encoded = enc.encode_corpus(corpus)  # the plan tokenises the corpus once, to encode it
    assert encoded.graph["backend"] == "openvino" and counted == [len(corpus)]
    assert encoded.graph["chosen"] == {"docs": len(corpus), "pays": False, "measured": False,
                                       "int8_prior": amx.int8_prior}
    assert sum("int8 is assumed no faster" in r.getMessage() for r in caplog.records) == 1
    # static int8 calibrated here since: the corpus's tokens are counted and the graphs weighed
    enc.planner.calibrated_graph  # noqa: B018 - calibrated and cached now
    weighed = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    weighed.__dict__["platform"] = amx
    monkeypatch.setattr(type(weighed.planner.speeds), "tokens_seconds_alternating", lambda self, graphs: [1.0, 1.0])
    assert weighed.planner.choice(prefixed(weighed.prompts.document, corpus)).measured["measured"] is True


def test_the_base_graphs_compiled_streams_are_dropped_before_a_calibration_and_not_compiled_for_its_checks(
        tiny_bi_encoder, monkeypatch):
    """A calibration does not run the base graph's compiled streams: its statistics pass compiles an observer of
    the model, and the checks read that pass's vectors and those of the check texts, kept just before the streams
    are dropped (``GraphReference.remember``). So the process never holds the base graph compiled beside the
    calibration's work, nor compiles it again for the checks; it is compiled again where it runs next."""
    from retr.retrieval.backends import quantize

    monkeypatch.setenv("RETR_INT8_DOT", "1")
    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph: the int8 graph's reference
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    before = enc.encode(TEXTS)  # the base graph compiled
    assert enc.graph.runner._compiled is not None
    held, real = [], quantize.quantize
    monkeypatch.setattr(quantize, "quantize", lambda *a, **k: held.append(
        enc.graph.runner._compiled is not None) or real(*a, **k))
    calibrated = enc.calibrated_graph
    assert calibrated is not None and held == [False] and enc.graph.runner._compiled is None
    assert calibrated.check > 0.9
    np.testing.assert_array_equal(enc.encode(TEXTS), before)  # compiled again: the same vectors


def test_a_refused_int8_weights_graph_leaves_small_corpora_to_the_base_graph(tiny_bi_encoder, monkeypatch, caplog):
    from retr.retrieval import corpus_weighing
    from retr.retrieval.backends.platform import Platform
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    monkeypatch.setattr(corpus_weighing, "WEIGHTS_MAKE_S", 0.0)  # weighed as if it cost nothing: a tiny corpus
    monkeypatch.setattr(corpus_weighing, "WEIGHTS_TIME_S", 0.0)
    calls = _counting_static_int8(monkeypatch)
    _patch_backend(monkeypatch, "openvino-int8w", floors={"bi": 1.01})  # no int8 graph can pass this floor
    # static int8 (assumed 2.03x the base graph) would save this corpus ~1 s: under its assumed cost
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: {"openvino": 0.005}[g.variant])
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu="VNNI three")
    with caplog.at_level("WARNING"):
        encoded = enc.encode_corpus(corpus)
    assert encoded.graph["backend"] == "openvino" and encoded.graph["chosen"]["against"] == "base"
    assert calls == [] and "openvino-int8w refused" in caplog.text
    np.testing.assert_array_equal(encoded.embeddings, enc.encode(corpus))
    # the next corpus meets the remembered refusal where the planner costs weighing that graph: the base graph again
    again = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    again.__dict__["platform"] = enc.platform
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert again.encode_corpus(corpus).graph["backend"] == "openvino"
    assert calls == [] and "openvino-int8w refused" in caplog.text


def test_int8_weights_are_symmetric_per_output_channel_and_dequantised_in_the_graph(tmp_path):
    """``export.compress_int8_weights``: each fixed MatMul weight (out, in) stored as int8 with one scale a row
    (its largest |w| / 127), every weight within half a step of the original, and the graph computes with the
    dequantised weights; the model given is left as it was (it is the checks' reference)."""
    import openvino as ov
    import openvino.opset13 as op

    from retr.retrieval.backends.export import WEIGHTS_INT8_GROUP, compress_int8_weights

    rng = np.random.default_rng(3)
    w = rng.normal(size=(5, 8)).astype(np.float32)
    w[2] = 0.0  # an all-zero row: scale 1, weights 0
    x = op.parameter([-1, 8], ov.Type.f32, name="x")
    model = ov.Model([op.matmul(x, op.constant(w), False, True)], [x], "m")
    compress_int8_weights(model, tmp_path / "m.xml", None)
    assert "Convert" not in {n.get_type_name() for n in model.get_ops()}  # the original model is untouched
    saved = ov.Core().read_model(str(tmp_path / "m.xml"))
    assert saved.get_rt_info(["runtime_options", "DYNAMIC_QUANTIZATION_GROUP_SIZE"]).astype(int) == WEIGHTS_INT8_GROUP
    assert ov.Core().compile_model(saved, "CPU").get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == WEIGHTS_INT8_GROUP
    (q,) = [n.get_data() for n in saved.get_ops() if n.get_type_name() == "Constant" and n.get_data().dtype == np.int8]
    (scale,) = [n.get_data() for n in saved.get_ops() if n.get_type_name() == "Constant"
                and n.get_data().shape == (5, 1)]
    np.testing.assert_allclose(scale[:, 0], np.where(np.abs(w).max(1) > 0, np.abs(w).max(1) / 127, 1.0), rtol=1e-6)
    assert np.abs(q).max() == 127 and not q[2].any()
    deq = q.astype(np.float32) * scale
    assert np.all(np.abs(deq - w) <= scale / 2 + 1e-7)
    feed = rng.normal(size=(3, 8)).astype(np.float32)
    out = ov.Core().compile_model(saved, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                 "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})(feed)[0]
    np.testing.assert_allclose(out, feed @ deq.T, rtol=1e-4, atol=1e-4)


# what a refused int8 graph was checked against, by the base graph's precision: an fp32 base graph is the int8
# graph's source and reference; a bf16 one is not a reference, so the graph built from the weights, in fp32, is
REFUSED_AGAINST = {"0": "disagrees with the openvino graph it is made from, in fp32",
                   "1": "disagrees with its graph built from the weights in fp32"}


@pytest.mark.parametrize("bf16", sorted(REFUSED_AGAINST))
def test_a_refused_corpus_graph_falls_back_to_the_openvino_graph_once(tiny_bi_encoder, tmp_path, monkeypatch, bf16):
    """On every CPU class: the int8 graph's source (and so the wording of its refusal) follows the base graph's
    precision, fixed here rather than read from the host (an AVX2-only CPU has an fp32 base graph)."""
    import json

    monkeypatch.setenv("RETR_BF16", bf16)
    calls = _counting_static_int8(monkeypatch, floors={"bi": 1.01})  # no int8 graph can pass this floor
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    encoded = enc.encode_corpus(corpus)
    assert encoded.graph["backend"] == "openvino"
    np.testing.assert_array_equal(encoded.embeddings, enc.encode(corpus))
    enc.encode_corpus(corpus)  # the refusal is remembered: no second calibration in this process
    again = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert again.encode_corpus(corpus).graph["backend"] == "openvino"  # nor in the next one: it is cached
    assert len(calls) == 1
    (int8,) = _int8_folders(tmp_path)
    meta = json.loads((int8 / "manifest.json").read_text())
    assert REFUSED_AGAINST[bf16] in meta["refused"] and "use --backend torch" in meta["refused"]
    assert [f.name for f in int8.iterdir()] == ["manifest.json"]


def test_int8_that_adds_ranking_noise_is_refused_until_the_bar_changes(tiny_bi_encoder, tmp_path, monkeypatch):
    import json

    calls = _counting_static_int8(monkeypatch, max_rank_noise={"bi": 0.0})  # any int8 graph adds some noise
    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert enc.encode_corpus(corpus).graph["backend"] == "openvino" and len(calls) == 1
    (int8,) = _int8_folders(tmp_path)
    meta = json.loads((int8 / "manifest.json").read_text())
    assert "ranking noise" in meta["refused"] and meta["rank_noise"] > 0.0
    assert meta["limits"] == {"floor": 0.98, "max_rank_noise": 0.0}
    calls2 = _counting_static_int8(monkeypatch, max_rank_noise={"bi": 1.0})  # another bar: judged again, and kept
    fresh = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert fresh.encode_corpus(corpus).graph["backend"] == DEFAULT and len(calls2) == 1
    assert json.loads((int8 / "manifest.json").read_text())["rank_noise"] == pytest.approx(meta["rank_noise"],
                                                                                         rel=1e-4)


def test_documents_added_after_the_int8_graph_was_refused_take_the_base_graph(tiny_bi_encoder, tmp_path,
                                                                               monkeypatch, caplog):
    import shutil

    corpus = [f"{w} {i}" for i, w in enumerate(TEXTS * 8)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    recorded = enc.encode_corpus(corpus).graph  # what an index's manifest records
    assert recorded["backend"] == DEFAULT
    np.testing.assert_array_equal(enc.encode_like(corpus[:3], recorded),
                                  enc.encode_corpus(corpus).embeddings[:3])  # the very graph, while it is cached
    (int8,) = _int8_folders(tmp_path)
    shutil.rmtree(int8)
    _counting_static_int8(monkeypatch, max_rank_noise={"bi": 0.0})  # judged again, and refused this time
    later = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    assert later.encode_corpus(corpus).graph["backend"] == "openvino"
    with caplog.at_level("WARNING"):
        added = later.encode_like(corpus[:3], recorded)
    np.testing.assert_array_equal(added, later.encode(corpus[:3]))
    assert "not in the cache here" in caplog.text


def test_the_feed_forward_int8_backend_quantises_only_the_feed_forward_matmuls(tiny_bi_encoder, tmp_path):
    import openvino as ov

    words = " ".join(TEXTS).split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 11)) for i in range(40)]

    def quantised(backend: str) -> tuple[int, int, np.ndarray]:
        enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend=backend, calibration_min_docs=30))
        encoded = enc.encode_corpus(corpus)
        assert encoded.graph["backend"] == backend
        model = ov.Core().read_model(str(enc.calibrated_graph.path))
        fq = [op for op in model.get_ops() if op.get_type_name() == "FakeQuantize"]
        return len(fq), sum(op.get_type_name() == "MatMul" for op in model.get_ops()), encoded.embeddings

    full, matmuls, full_emb = quantised("openvino-int8")
    ffn, matmuls_ffn, ffn_emb = quantised("openvino-int8-ffn")
    assert matmuls == matmuls_ffn and 0 < ffn < full  # the same graph, fewer MatMuls fed through int8
    plain = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino")).encode(corpus)
    assert (ffn_emb * plain).sum(1).min() >= 0.97 and not np.array_equal(ffn_emb, full_emb)


@pytest.mark.parametrize("kind", ["bi", "ce"])
def test_dynamic_int8_keeps_the_down_projections_in_fp32_and_quantises_every_other_weight_matmul(
        kind, tiny_bi_encoder, tiny_cross_encoder, tmp_path):
    import onnx
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from retr.retrieval.backends.export import SCORING, down_projections
    from retr.retrieval.backends.graphs import _export_fp32

    model, graph_kind = ((SentenceTransformer(str(tiny_bi_encoder), device="cpu"), EMBEDDING) if kind == "bi"
                         else (CrossEncoder(str(tiny_cross_encoder), device="cpu"), SCORING))
    src = tmp_path / "model.fp32.onnx"
    _export_fp32(model, "h" * 32, graph_kind, src)
    fp32 = onnx.load(str(src))
    inits = {w.name: tuple(w.dims) for w in fp32.graph.initializer}
    by_weight = [n.name for n in fp32.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    down = down_projections(src)
    # the tiny BERT (hidden 32, intermediate 37): one feed-forward output per layer (a cross-encoder's head is a Gemm,
    # not quantised)
    assert down and all(inits[n.input[1]][0] > inits[n.input[1]][1] for n in fp32.graph.node if n.name in down)
    assert len(down) == sum(1 for n in fp32.graph.node if n.name in by_weight and "output/dense" in n.name
                            and "attention" not in n.name)
    dst = tmp_path / "model.onnx"
    registry.BACKENDS["onnx-int8"].convert(src, dst, None)
    nodes = {n.name: n.op_type for n in onnx.load(str(dst)).graph.node}
    assert all(nodes.get(n) == "MatMul" for n in down)  # left as they were
    quantised = [n for n in by_weight if n not in down]
    assert quantised and all(nodes.get(n) != "MatMul" for n in quantised)  # replaced by integer MatMuls


@pytest.mark.parametrize("kind", ["bi", "ce"])
def test_graphs_are_exported_with_eager_attention_and_compute_what_sdpas_export_does(
        kind, tiny_bi_encoder, tiny_cross_encoder, tmp_path):
    """Export generation 3: attention exported as transformers' eager matmuls and softmax (which OpenVINO fuses),
    not TorchScript's decomposition of SDPA (IsNaN/Where masking); the same outputs (fp32); the model keeps its
    own attention implementation after the export."""
    import onnx
    import onnxruntime as ort
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from retr.retrieval.backends.export import export_embedding, export_scoring

    if kind == "bi":
        model = SentenceTransformer(str(tiny_bi_encoder), device="cpu")
        hf, export = model[0].auto_model, export_embedding
        feeds = dict(model.tokenizer(["wolves in forests", "a much longer text about wolves and rivers"],
                                     padding=True, return_tensors="np"))
        feeds.pop("token_type_ids", None)
    else:
        model = CrossEncoder(str(tiny_cross_encoder), device="cpu")
        hf, export = model.model, export_scoring
        feeds = dict(model.tokenizer([("wolves", "wolves in forests"), ("rivers", "a much longer text about rivers")],
                                     padding=True, return_tensors="np", return_token_type_ids=True))
    hf.set_attn_implementation("sdpa")
    outputs, ops = {}, {}
    for eager in (True, False):
        path = tmp_path / f"{kind}-{eager}.onnx"
        export(model, path, eager=eager)
        assert hf.config._attn_implementation == "sdpa"  # given back after the export
        ops[eager] = {n.op_type for n in onnx.load(str(path)).graph.node}
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs[eager] = session.run(None, {k: v.astype(np.int64) for k, v in feeds.items()})[0]
    assert "IsNaN" in ops[False] and "IsNaN" not in ops[True] and "Softmax" in ops[True]
    np.testing.assert_allclose(outputs[True], outputs[False], atol=1e-5)


def _batches(lengths, budget, parts=1):
    from retr.retrieval.backends.batching import length_batches

    return [(idx.tolist(), width, mask) for idx, width, mask in length_batches(np.asarray(lengths), budget, parts)]


def test_length_batches_cover_every_text_once_padded_to_their_widest():
    rng = np.random.default_rng(3)
    for parts in (1, 2, 3):
        for _ in range(50):
            lengths = rng.integers(1, 130, rng.integers(1, 40))
            batches = _batches(lengths, int(rng.choice([256, 1024, 8192])), parts)
            seen = sorted(i for idx, _, _ in batches for i in idx)
            assert seen == list(range(len(lengths)))
            for idx, width, mask in batches:
                assert width >= max(lengths[i] for i in idx) and mask.shape == (len(idx), width)
                assert mask.sum(1).tolist() == [lengths[i] for i in idx]


def test_one_querys_pairs_are_balanced_over_the_streams():
    """A query's 20 cross-encoder pairs on 2 streams: two batches of 10, where the plain token budget split them
    9 + 9 + 2 (the last two then waited for a stream). With ``parts`` there are at most as many batches as the
    budget needs rounded up to a multiple of ``parts``, and the largest padded batch is the smallest that any
    contiguous split into that many reaches (brute force)."""
    import itertools

    from retr.retrieval.backends.batching import WIDTH_STEP

    lengths = [128] * 17 + [120, 96, 70]
    old = _batches(lengths, -(-sum(lengths) // 2))  # what the reranker asked for before
    assert [len(i) for i, _, _ in old] == [9, 9, 2]
    assert [len(i) for i, _, _ in _batches(lengths, 8192, parts=2)] == [10, 10]
    assert [len(i) for i, _, _ in _batches(lengths, 8192)] == [20]  # one stream: the budget alone, as before
    rng = np.random.default_rng(5)
    for _ in range(60):
        n, parts = int(rng.integers(2, 12)), int(rng.integers(2, 4))
        lengths = np.sort(rng.integers(1, 100, n))[::-1]
        budget = int(rng.choice([128, 512, 8192]))
        got = _batches(lengths, budget, parts)
        wanted = -(-len(_batches(lengths, budget)) // parts) * parts
        widths = [min(-(-int(x) // WIDTH_STEP) * WIDTH_STEP, int(lengths.max())) for x in lengths]
        best = min(max((b - a) * widths[a] for a, b in zip((0,) + cuts, cuts + (n,), strict=True))
                   for k in range(min(wanted, n)) for cuts in itertools.combinations(range(1, n), k))
        assert len(got) <= wanted and max(len(i) * w for i, w, _ in got) == best, (lengths.tolist(), budget, parts)


def test_one_tokenisation_gives_a_corpus_its_ids_and_its_untruncated_lengths(tiny_bi_encoder):
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino", max_length=12,
                                  doc_prompt="passage: "))
    texts = [" ".join(TEXTS) * 2, "tea", "", TEXTS[1], "solar panels " * 5]
    plan = enc.corpus_plan(texts)
    assert plan.truncation == enc.tokens.truncation(texts)  # a second, untruncated tokenisation counts the same
    assert plan.truncation["truncated"] == 3 and plan.truncation["longest"] > 40
    want = enc.tokens.ids(["passage: " + t for t in texts])
    assert [t.tolist() for t in plan.tokens] == [t.tolist() for t in want] and max(map(len, want)) == 12


def test_without_a_tokenizer_json_the_torch_tokenizer_gives_the_same_tokens(tiny_bi_encoder, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny_bi_encoder, bare)
    removed = list(bare.rglob("tokenizer.json"))
    for f in removed:
        f.unlink()
    shutil.copy(tiny_bi_encoder.parent / "bert" / "vocab.txt", bare)  # a slow tokenizer's vocabulary, as it is kept
    cfg = {"backend": "torch", "max_length": 12, "doc_prompt": "passage: "}
    fast = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), **cfg)).tokens
    slow = BiEncoder(EncoderConfig(model=str(bare), **cfg)).tokens  # tokenises through the torch model's tokenizer
    assert removed and fast.fast and not slow.fast
    texts = [" ".join(TEXTS) * 2, "tea", "", TEXTS[1]]
    assert [list(x) for x in slow.ids(texts)] == [list(x) for x in fast.ids(texts)]
    np.testing.assert_array_equal(slow.token_counts(texts), fast.token_counts(texts))
    assert slow.token_offsets(texts) == fast.token_offsets(texts)
    assert slow.truncation(texts) == fast.truncation(texts) and fast.truncation(texts)["truncated"] == 2
    ids, counts = slow.counted(texts)  # no single tokenisation gives both here
    assert counts is None and [list(x) for x in ids] == [list(x) for x in fast.ids(texts)]


def test_a_first_run_on_an_empty_home_starts_no_vendor_telemetry_and_prints_each_line_once(tiny_bi_encoder,
                                                                                            tiny_dataset, tmp_path):
    """Issue 41 case 27: importing OpenVINO starts its telemetry, which on a fresh HOME writes ~/intel and logs
    through the root logger (every retr line then printed twice, bm25s DEBUG lines leaking). A first `retr index`
    in a subprocess with an empty HOME and cache: no telemetry folder, each retr line once, no DEBUG line."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RETR_CACHE": str(tmp_path / "cache")}
    env.pop("RETR_INT8_DOT", None)
    proc = subprocess.run([sys.executable, "-m", "retr.cli.main", "index", "--corpus", str(tiny_dataset),
                           "--out", str(tmp_path / "idx"), "--model", str(tiny_bi_encoder)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    retr_lines = [ln for ln in lines if ln.startswith("[retr]")]
    assert any("to openvino" in ln for ln in retr_lines), proc.stderr[-2000:]  # the graph was made in this run
    assert len(retr_lines) == len(set(retr_lines)), proc.stderr[-2000:]
    assert not any(ln.partition(" ")[2] in ln2 for ln in retr_lines for ln2 in lines if not ln2.startswith("[retr]")), \
        proc.stderr[-2000:]  # nothing printed again by a root handler
    assert "DEBUG" not in proc.stderr and "%|" not in proc.stderr, proc.stderr[-2000:]  # no bars, no debug lines
    assert not (home / "intel").exists(), sorted(p.name for p in home.iterdir())


def test_third_party_lines_reach_retrs_debug_log_once_under_debug_logging():
    """Under `retr -v` retr's own debug lines reach the root logger too: the handler that routes third-party
    records to retr's debug log must not take its own lines again (it recursed until the export failed)."""
    import logging

    from retr.retrieval.backends.quiet import quiet_third_party

    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record.getMessage())

    keep, retr_logger = Keep(), logging.getLogger("retr")
    level = retr_logger.level
    retr_logger.addHandler(keep)
    retr_logger.setLevel(logging.DEBUG)
    try:
        with quiet_third_party("nncf"):
            logging.getLogger("nncf").info("statistics collected")
            logging.getLogger().warning("root advice")
    finally:
        retr_logger.removeHandler(keep)
        retr_logger.setLevel(level)
    assert got == ["nncf: statistics collected", "root: root advice"]


def test_a_graph_just_made_runs_again_after_its_session_is_released(tiny_bi_encoder):
    """A graph is made in a temporary folder and published in one rename: a session released (a search timing its
    query candidates drops the documents' one) is made again from the published file, not the temporary one."""
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"))  # made now: the cache is empty
    feed = {"input_ids": np.array([[1, 7, 2]]), "attention_mask": np.ones((1, 3), dtype=np.int64)}
    want = enc.graph.runner(feed)
    assert enc.graph.runner.release()
    np.testing.assert_array_equal(enc.graph.runner(feed), want)  # NO_SUCHFILE: the .building folder, before
