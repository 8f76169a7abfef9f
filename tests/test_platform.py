"""The Platform value and the chooser: flags only prune, measured speeds choose (fake platforms and fake timings,
never a timed assertion)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest

from retr.retrieval.backends import chooser, cost, registry, timing
from retr.retrieval.backends import platform as platform_mod
from retr.retrieval.backends.chooser import DOCUMENTS, PAIRS, QUERIES, Timing
from retr.retrieval.backends.platform import Platform, this_platform, usable_flags

AVX2 = Platform.of({"avx", "avx2", "fma"}, cpu="AMD EPYC (AVX2 only)")
VNNI = Platform.of({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, cpu="AMD EPYC 9R14")  # AVX-512, no AMX
AMX = Platform.of(VNNI.flags | {"amx_bf16", "amx_int8", "amx_tile"}, cpu="Intel Xeon 8481C")
STATIC = [registry.BACKENDS[n] for n in ("openvino-int8", "openvino-int8-ffn")]
UNCALIBRATED = [registry.BACKENDS[n] for n in ("openvino", "onnx", "onnx-int8")]


def test_the_platform_reads_flags_once_into_precision_and_the_expected_score_kind(monkeypatch):
    assert (AVX2.precision, AVX2.static_int8, AVX2.kind) == ("fp32", False, "fp32")
    assert (VNNI.precision, VNNI.static_int8, VNNI.kind) == ("bf16", True, "bf16+int8")
    assert (AMX.precision, AMX.static_int8, AMX.amx, AMX.kind) == ("bf16", True, True, "bf16")
    vnni_laptop = Platform.of({"avx2", "avx_vnni"})
    assert (vnni_laptop.precision, vnni_laptop.kind) == ("fp32", "fp32+int8")
    assert Platform.of(set(), cores=64).threads == 4 and Platform.of(set(), cores=1).threads == 1
    # the overrides: RETR_BF16 / RETR_INT8_DOT, read into the value
    monkeypatch.setenv("RETR_BF16", "0")
    monkeypatch.setenv("RETR_INT8_DOT", "0")
    p = this_platform()
    assert (p.precision, p.static_int8, p.kind) == ("fp32", False, "fp32")
    monkeypatch.setenv("RETR_BF16", "1")
    monkeypatch.setenv("RETR_INT8_DOT", "1")
    p = this_platform()
    assert (p.precision, p.static_int8, p.kind) == ("bf16", True, "bf16+int8")
    assert p.cpu and p.to_dict()["cpu"] == p.cpu


def test_what_the_process_may_not_use_is_taken_from_the_flags_and_named_in_the_cpu(monkeypatch):
    """AMX the kernel refuses, and a ONEDNN_MAX_CPU_ISA ceiling, leave the flags of the CPU that would result;
    the limit is named in the CPU string, so choices measured under it are stored apart."""
    asked = []
    granted = lambda: asked.append(1) or False  # noqa: E731
    assert usable_flags(AMX.flags, None, granted) == (VNNI.flags, ["AMX not granted by the kernel"])
    assert usable_flags(VNNI.flags, None, granted) == (VNNI.flags, []) and len(asked) == 1  # no AMX: not asked
    assert usable_flags(AMX.flags, None, lambda: True) == (AMX.flags, [])
    assert usable_flags(AMX.flags, "avx512_core_bf16", lambda: True) == (VNNI.flags, ["ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"])
    flags, _ = usable_flags(AMX.flags, "AVX512_CORE_VNNI", lambda: True)
    assert Platform.of(flags).kind == "fp32+int8"  # Ice Lake's: no bf16, VNNI
    flags, _ = usable_flags(AMX.flags | {"avx_vnni"}, "AVX2", lambda: True)
    assert flags == {"avx2"} and Platform.of(flags).kind == AVX2.kind
    assert usable_flags(AMX.flags, "ALL", lambda: True) == (AMX.flags, [])
    assert usable_flags(AVX2.flags, "AVX512_CORE_BF16", lambda: True) == (AVX2.flags, [])  # nothing taken: unnamed
    monkeypatch.setattr(platform_mod, "_cpuinfo", lambda: (AMX.cpu, AMX.flags))
    monkeypatch.setattr(platform_mod, "amx_granted", lambda: False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    p = this_platform()
    assert p.cpu == "Intel Xeon 8481C [AMX not granted by the kernel; ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI]"
    assert (p.amx, p.precision, p.kind) == (False, "fp32", "fp32+int8")


@pytest.mark.parametrize("platform,static_kept", [(AVX2, False), (VNNI, True), (AMX, True)])
def test_flags_prune_only_what_cannot_run_natively(platform, static_kept):
    """AVX2-only: static int8 is pruned (its MatMuls would be emulated); no-AMX and AMX CPUs keep it as a
    candidate (whether it pays is measured); uncalibrated graphs always run."""
    kept, pruned = chooser.prune(platform, STATIC + UNCALIBRATED)
    names = [b.name for b in kept]
    assert names[-3:] == ["openvino", "onnx", "onnx-int8"]
    assert (("openvino-int8" in names) is static_kept) and (("openvino-int8-ffn" in names) is static_kept)
    assert [b for b, _ in pruned] == ([] if static_kept else ["openvino-int8", "openvino-int8-ffn"])
    assert all("int8 dot-product" in why for _, why in pruned)
    assert registry.on_this_cpu(registry.BACKENDS["openvino-int8"], platform=platform).name == \
        ("openvino-int8" if static_kept else "openvino")


def test_a_runtime_that_is_not_installed_is_pruned(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnxruntime" else real(name))
    kept, pruned = chooser.prune(VNNI, UNCALIBRATED)
    assert [b.name for b in kept] == ["openvino"]
    assert pruned == [("onnx", "onnxruntime is not installed"), ("onnx-int8", "onnxruntime is not installed")]


@pytest.mark.parametrize("role", [QUERIES, DOCUMENTS, PAIRS])
def test_the_chooser_picks_the_fastest_candidate_that_passed(role):
    timings = [Timing("openvino", 0.0057), Timing("onnx", 0.0049), Timing("onnx-int8", 0.0032)]
    choice = chooser.choose(role, timings, "openvino")
    assert choice.backend == "onnx-int8" and "3.20" in choice.why and "onnx" in choice.why
    timings[0] = Timing("openvino", 0.0021)  # another machine: the base graph is fastest
    assert chooser.choose(role, timings, "onnx").backend == "openvino"


def test_a_candidate_that_failed_its_check_is_never_picked_however_fast():
    timings = [Timing("openvino", 0.0057), Timing("onnx-int8", 0.0001, passed=False, why="cosine 0.91 < 0.985"),
               Timing("onnx", None, why="not in the cache")]
    choice = chooser.choose(QUERIES, timings, "openvino")
    assert choice.backend == "openvino" and "onnx-int8" in choice.why
    alone = chooser.choose(QUERIES, [timings[1], timings[2]], "openvino")  # nothing passed: the configured graph
    assert alone.backend == "openvino" and "no candidate" in alone.why
    tie = chooser.choose(QUERIES, [Timing("openvino", 0.003), Timing("onnx", 0.003)], "onnx")
    assert tie.backend == "openvino"  # ties go to the configured (first) candidate
    back = chooser.Choice.from_dict(choice.to_dict())
    assert (back.backend, [t.backend for t in back.timings], back.timings[1].passed) == \
        ("openvino", ["openvino", "onnx-int8", "onnx"], False)
    # agreement passed, ranking noise did not (a fake measurement): refused however fast, its noise kept
    noisy = [Timing("openvino", 0.0057), Timing("onnx", 0.0049, rank_noise=0.004),
             Timing("onnx-int8", 0.0032, passed=False, rank_noise=0.071, why="ranking noise 0.0710 > 0.05")]
    picked = chooser.choose(QUERIES, noisy, "openvino")
    assert picked.backend == "onnx" and "failed their checks: onnx-int8" in picked.why
    stored = chooser.Choice.from_dict(picked.to_dict())
    assert [(t.rank_noise, t.passed) for t in stored.timings] == [(None, True), (0.004, True), (0.071, False)]


@pytest.mark.parametrize("role", [QUERIES, DOCUMENTS, PAIRS])
def test_a_graph_that_adds_ranking_noise_is_taken_only_where_it_is_more_than_the_margin_faster(role):
    """Within NOISE_FREE_MARGIN (10%) of the fastest, the fastest graph that computes as the reference does wins:
    a shared machine's timings move that much, and issue 39's bar is 10% of the fastest."""
    margin = chooser.NOISE_FREE_MARGIN
    exact = [Timing("openvino", 0.0040), Timing("openvino:one-stream", 0.0030)]
    close = chooser.choose(role, [*exact, Timing("onnx-int8", 0.0030 / (1 + margin) * 1.01, rank_noise=0.03)],
                           "openvino")
    assert close.backend == "openvino:one-stream" and "adds no ranking noise" in close.why
    clear = chooser.choose(role, [*exact, Timing("onnx-int8", 0.0030 / (1 + margin) * 0.99, rank_noise=0.03)],
                           "openvino")
    assert clear.backend == "onnx-int8" and "fastest of 3" in clear.why
    # candidates that add no noise among themselves: the fastest, however close
    assert chooser.choose(role, [Timing("openvino", 0.00301), Timing("onnx", 0.0030)], "openvino").backend == "onnx"
    # no candidate without noise passed: the fastest noisy one
    alone = [Timing("openvino", 0.001, passed=False), Timing("onnx-int8", 0.0030, rank_noise=0.03)]
    assert chooser.choose(role, alone, "openvino").backend == "onnx-int8"
    # static int8 documents: 8% faster (an AMX Xeon's measurement) does not pay, even already calibrated
    assert not cost.calibration_pays(10 ** 6, 0.0160, AMX, int8_s=0.0148, calibration_s=0.0).pays
    assert cost.calibration_pays(10 ** 6, 0.0160, AMX, int8_s=0.0140, calibration_s=0.0).pays


def test_calibration_pays_only_where_the_measured_saving_exceeds_its_cost():
    # the AVX-512 EPYC: base 52 docs/s, int8 75 docs/s, calibration 19 s -> break-even ~3,300 documents
    small = cost.calibration_pays(1000, 1 / 52, VNNI, int8_s=1 / 75, calibration_s=19.0)
    large = cost.calibration_pays(5183, 1 / 52, VNNI, int8_s=1 / 75, calibration_s=19.0)
    assert not small.pays and large.pays and small.measured
    assert 3000 < small.break_even_docs < 3500 and small.to_dict()["break_even_docs"] == round(small.break_even_docs)
    assert cost.calibration_pays(100, 1 / 52, VNNI, int8_s=1 / 75, calibration_s=0.0).pays  # already calibrated
    slower = cost.calibration_pays(10 ** 6, 1 / 52, VNNI, int8_s=1 / 40, calibration_s=0.0)
    assert not slower.pays and slower.to_dict()["break_even_docs"] is None  # int8 slower: never
    assert slower.break_even_phrase() == "int8 is no faster here"  # not "~None documents"
    assert small.break_even_phrase() == f"int8 pays from ~{round(small.break_even_docs)} documents"
    prior = cost.calibration_pays(1000, 1 / 52, AMX)  # not measured: AMX's prior says int8 is no faster
    assert not prior.measured and not prior.pays and prior.int8_s > prior.base_s


def test_a_stored_choice_is_keyed_by_model_candidates_cpu_and_versions(tmp_path):
    store = chooser.ChoiceStore(tmp_path)
    key = chooser.choice_key("h" * 64, QUERIES, ["openvino/export4/bf16", "onnx/export4/fp32"], VNNI)
    assert store.get(key) is None
    store.put(key, chooser.choose(QUERIES, [Timing("openvino", 0.004), Timing("onnx", 0.003)], "openvino"))
    assert store.get(key).backend == "onnx" and not store.get(key).measured
    others = {chooser.choice_key("h" * 64, QUERIES, ["openvino/export4/bf16"], VNNI),
              chooser.choice_key("h" * 64, QUERIES, ["openvino/export4/bf16", "onnx/export4/fp32"], AMX),
              chooser.choice_key("g" * 64, QUERIES, ["openvino/export4/bf16", "onnx/export4/fp32"], VNNI),
              chooser.choice_key("h" * 64, DOCUMENTS, ["openvino/export4/bf16", "onnx/export4/fp32"], VNNI)}
    assert key not in others and len(others) == 4
    path = tmp_path / "choices" / f"{key}.json"
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "backend": "openvino", "candidates": [
        {**c, "passed": c["backend"] != "openvino"} for c in stored["candidates"]]}))
    assert store.get(key) is None  # names a candidate its own record says failed its check: timed again
    for damaged in ("{not json", "[]", '{"role": "queries"}', json.dumps({**stored, "candidates": [1]})):
        path.write_text(damaged)
        assert store.get(key) is None, damaged  # a damaged entry: timed again


def test_queries_take_the_measured_fastest_cached_graph_and_the_choice_is_stored(tiny_bi_encoder, monkeypatch):
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.export import EMBEDDING
    from retr.retrieval.backends.graphs import load_or_export
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import QueryGraphs

    monkeypatch.setattr(QueryGraphs, "one_stream", lambda self: None)  # graphs of other files alone here

    cfg = EncoderConfig(model=str(tiny_bi_encoder))
    enc = BiEncoder(cfg)
    assert enc.query_graphs.choice is None and enc.query_graph is enc.graph  # one candidate: nothing timed
    load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, enc.max_length,
                   cache_home())
    speeds = {"openvino": 0.004, "onnx": 0.002}
    timed = []
    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: timed.append(g.variant) or speeds[g.variant])
    fresh = BiEncoder(cfg)
    assert fresh.query_graph.variant == "onnx" and sorted(timed) == ["onnx", "openvino"]
    chosen = fresh.describe_queries()["chosen"]
    assert chosen["backend"] == "onnx" and [c["backend"] for c in chosen["candidates"]] == ["openvino", "onnx"]
    q = fresh.encode_queries(["wolves in the forest"])
    np.testing.assert_allclose(q, enc.encode_queries(["wolves in the forest"]), atol=1e-3)
    timed.clear()
    again = BiEncoder(cfg)  # the stored choice: nothing timed again
    assert again.query_graph.variant == "onnx" and timed == []
    speeds.update(openvino=0.001)
    given = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), query_backend="openvino"))  # an override wins
    assert given.query_graph.variant == "openvino" and given.query_graphs.choice is None and timed == []
    # the candidate's ranking noise was measured once with its timing, and stored with it
    noise = {c["backend"]: c.get("rank_noise") for c in chosen["candidates"]}
    assert noise["openvino"] is None and 0 <= noise["onnx"] < 0.05


def test_a_query_candidate_not_taken_holds_no_session_once_the_choice_is_made(tiny_bi_encoder, monkeypatch):
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.export import EMBEDDING
    from retr.retrieval.backends.graphs import load_or_export
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import QueryGraphs

    monkeypatch.setattr(QueryGraphs, "one_stream", lambda self: None)  # graphs of other files alone here
    cfg = EncoderConfig(model=str(tiny_bi_encoder))
    enc = BiEncoder(cfg)
    load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, enc.max_length,
                   cache_home())
    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: {"openvino": 0.001, "onnx": 0.004}[g.variant])
    timed = BiEncoder(cfg)
    assert timed.query_graph.variant == "openvino"
    onnx = timed.query_graphs.candidates["onnx"].runner
    assert onnx._session is None  # opened to measure its ranking noise, then dropped once not taken
    again = BiEncoder(cfg)  # the stored choice: the candidate not taken is never opened
    assert again.query_graph.variant == "openvino" and again.query_graphs.candidates["onnx"].runner._session is None
    ids = np.asarray(again.tokens.ids(["wolves in the forest"]), dtype=np.int64)
    vec = again.query_graphs.candidates["onnx"].runner({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert vec.shape[0] == 1  # opened on use


def test_a_query_graph_beyond_the_ranking_noise_bar_is_never_picked_however_fast(tiny_bi_encoder, monkeypatch):
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.export import EMBEDDING, pair_noise
    from retr.retrieval.backends.graphs import load_or_export
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import MAX_QUERY_RANK_NOISE, QueryGraphs

    monkeypatch.setattr(QueryGraphs, "one_stream", lambda self: None)  # graphs of other files alone here

    base = np.eye(4, dtype=np.float32)[:2]
    docs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    assert pair_noise(base @ docs.T, base @ docs.T) == 0.0  # QueryGraphs.noise's formula
    assert pair_noise(base @ docs.T, base[::-1] @ docs.T) > MAX_QUERY_RANK_NOISE  # the questions swapped: all noise
    cfg = EncoderConfig(model=str(tiny_bi_encoder))
    enc = BiEncoder(cfg)
    load_or_export(lambda: enc.model, enc.model_hash, registry.BACKENDS["onnx"], EMBEDDING, enc.max_length,
                   cache_home())
    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: {"openvino": 0.004, "onnx": 0.001}[g.variant])
    monkeypatch.setattr(QueryGraphs, "noise", lambda self, g: 0.08)  # a fake measurement: over the bar
    fresh = BiEncoder(cfg)
    assert fresh.query_graph.variant == "openvino"
    onnx = next(t for t in fresh.query_graphs.choice.timings if t.backend == "onnx")
    assert (onnx.passed, onnx.rank_noise) == (False, 0.08) and "ranking noise 0.0800 > 0.05" in onnx.why
    assert "failed their checks: onnx" in fresh.query_graphs.choice.why


def test_a_small_corpus_is_not_calibrated_where_the_measured_saving_is_below_the_cost(tiny_bi_encoder, monkeypatch):
    from retr.retrieval.backends.graphs import Graph
    from retr.retrieval.corpus_speeds import DocumentSpeeds
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    monkeypatch.delenv("RETR_INT8_DOT")
    convert = registry.BACKENDS["openvino-int8"].convert
    calls = []
    entries = dict(registry.BACKENDS)
    entries["openvino-int8"] = replace(entries["openvino-int8"], convert=lambda *a, **k: calls.append(1) or convert(*a, **k))
    monkeypatch.setattr(registry, "BACKENDS", MappingProxyType(entries))
    speeds = {"openvino": 0.02, "openvino-int8": 0.01, "openvino-int8w": 0.019}  # int8w: within the margin
    monkeypatch.setattr(DocumentSpeeds, "doc_seconds", lambda self, g, tokens: speeds[g.variant])
    corpus = [f"document {i} about wolves and forests number {i}" for i in range(40)]
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = VNNI  # an AVX-512 VNNI CPU: static int8 is a candidate, its cost assumed
    encoded = enc.encode_corpus(corpus)  # 40 docs save 40 * 6 ms << the assumed calibration: the built graph
    assert encoded.graph["backend"] == "openvino" and calls == []
    assert encoded.graph["chosen"]["pays"] is False and encoded.graph["chosen"]["measured"] is False
    enc.__dict__["platform"] = AVX2  # pruned: nothing measured, nothing calibrated
    fresh = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    fresh.__dict__["platform"] = AVX2
    assert fresh.encode_corpus(corpus).graph.get("chosen") is None and calls == []
    assert isinstance(enc.graph, Graph)


def test_a_graph_identity_is_one_value_naming_backend_calibration_export_and_precision():
    from retr.retrieval.backends.graphs import EXPORT_GENERATION, GraphId

    g = GraphId("h" * 64, "openvino", EXPORT_GENERATION, "bf16")
    assert g.key == f"openvino/export{EXPORT_GENERATION}/bf16"  # as embedding cache keys always spelled it
    c = GraphId("h" * 64, "openvino-int8", EXPORT_GENERATION, "bf16", "abcdef0123456789ffff")
    assert c.key == f"openvino-int8@abcdef0123456789/export{EXPORT_GENERATION}/bf16"
    assert GraphId("h" * 64, "torch", None).key == "torch"
    assert len({g.key, c.key, replace(g, precision="fp32").key, replace(g, generation=EXPORT_GENERATION - 1).key}) == 4


def test_the_documents_graph_as_one_stream_is_a_query_candidate_timed_and_checked(tiny_bi_encoder, monkeypatch):
    """With two or more streams, the documents' OpenVINO graph compiled as one stream over all its threads is a
    query candidate (the same file: nothing made): timed, checked for ranking noise like any other, chosen where
    faster; its vectors are the documents' graph's."""
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import ONE_STREAM, QueryGraphs

    cfg = EncoderConfig(model=str(tiny_bi_encoder))
    enc = BiEncoder(cfg)
    if enc.graph.runner.parallel < 2:
        pytest.skip("one core: the documents' graph runs one stream already")
    name = "openvino" + ONE_STREAM
    assert set(enc.query_graphs.candidates) == {"openvino", name}
    one = enc.query_graphs.candidates[name]
    assert one.path == enc.graph.path and one.runner.parallel == 1 and one.runner._model is enc.graph.runner._model
    timed = []
    monkeypatch.setattr(QueryGraphs, "seconds",
                        lambda self, g: timed.append(g.runner.parallel) or (0.001 if g.runner.parallel == 1 else 0.004))
    fresh = BiEncoder(cfg)
    assert fresh.query_graph.runner.parallel == 1 and sorted(timed) == [1, enc.graph.runner.parallel]
    chosen = fresh.describe_queries()["chosen"]
    assert chosen["backend"] == name
    noise = {c["backend"]: c.get("rank_noise") for c in chosen["candidates"]}
    assert noise["openvino"] is None and noise[name] is None  # the same file and precision: not checked
    q = ["wolves in the forest", "solar panels on roofs"]
    np.testing.assert_allclose(fresh.encode_queries(q), enc.encode(q), atol=1e-3)


def _no_weights_graph(monkeypatch) -> None:
    """The calibrated backends without an int8 graph made without calibration (``Backend.uncalibrated``): a
    corpus then weighs the calibration against the base graph alone."""
    entries = {n: replace(b, uncalibrated=None) if b.calibrated else b for n, b in registry.BACKENDS.items()}
    monkeypatch.setattr(registry, "BACKENDS", MappingProxyType(entries))


def _fake_token_speeds(monkeypatch, speeds: dict[str, float], timed: list) -> None:
    """Per-token speeds of the document graphs, timed alone or in alternation (fake, recorded in ``timed``)."""
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    def seconds(self, graph):
        timed.append(graph.variant)
        return speeds[graph.variant]

    monkeypatch.setattr(DocumentSpeeds, "token_seconds", seconds)
    monkeypatch.setattr(DocumentSpeeds, "tokens_seconds_alternating", lambda self, gs: [seconds(self, g) for g in gs])


def test_the_calibration_break_counts_the_corpus_tokens_not_only_its_documents(tiny_bi_encoder, monkeypatch):
    """Two corpora of as many documents: short ones save less than the calibration costs, long ones more (the
    sample's per-token time times the tokens the graph will run: SciFact's ~240 a document, NPL's ~40)."""
    from retr.retrieval.corpus_speeds import DocumentSpeeds
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    monkeypatch.delenv("RETR_INT8_DOT")
    _no_weights_graph(monkeypatch)  # the base graph against static int8 alone
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, g: 0.05)  # base graph, per token (fake)
    short = [f"wolves {i}" for i in range(40)]
    long = [f"document {i} " + "about wolves and forests and the rivers between them " * 6 for i in range(40)]
    decided = {}
    for name, corpus in (("short", short), ("long", long)):
        enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
        enc.__dict__["platform"] = VNNI
        choice = enc.planner.choice(corpus)
        tokens = sum(len(r) for r in enc.tokens.ids(corpus))
        assert choice.measured["base_s"] * 40 == pytest.approx(0.05 * tokens)
        decided[name] = choice.calibrated
    assert decided == {"short": False, "long": True}


def test_with_the_int8_graph_made_a_later_corpus_reads_the_stored_per_token_speeds(tiny_bi_encoder, monkeypatch):
    """The base and int8 graphs' per-token speeds are the machine's, not the corpus's: timed once, stored, and read
    for the next corpus (no timing, no base graph compiled just to time it)."""
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    monkeypatch.delenv("RETR_INT8_DOT")
    timed = []
    speeds = {"openvino": 0.05, "openvino-int8": 0.01}
    _fake_token_speeds(monkeypatch, speeds, timed)
    cfg = EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30)
    first = BiEncoder(cfg)
    first.__dict__["platform"] = VNNI
    assert first.planner.calibrated_graph is not None  # made (calibrated) here, as a first large corpus would
    corpus = [f"document {i} about wolves and forests" for i in range(40)]
    assert first.planner.choice(corpus).calibrated and sorted(timed) == ["openvino", "openvino-int8"]
    timed.clear()
    later = BiEncoder(cfg)
    later.__dict__["platform"] = VNNI
    other = [f"note {i} on rivers" for i in range(50)]
    choice = later.planner.choice(other)
    assert choice.calibrated and choice.measured["measured"] and timed == []
    assert choice.measured["int8_s"] == pytest.approx(0.01 * sum(len(r) for r in later.tokens.ids(other)) / 50)


def test_where_int8_is_assumed_no_faster_nothing_is_timed_until_the_int8_graph_exists(tiny_bi_encoder, monkeypatch):
    """On AMX (int8 assumed x0.97 of the base graph) no corpus could pay for a calibration: the base graph encodes
    and nothing is timed on a first run. Once the int8 graph is made (`retr doctor --export`), both graphs are
    timed and the measured speeds decide, whatever the prior said."""
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    monkeypatch.delenv("RETR_INT8_DOT")
    timed = []
    speeds = {"openvino": 0.05, "openvino-int8": 0.01}  # measured here: int8 faster after all
    _fake_token_speeds(monkeypatch, speeds, timed)
    cfg = EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30)
    corpus = [f"document {i} about wolves and forests and rivers" * 3 for i in range(5000)]
    first = BiEncoder(cfg)
    first.__dict__["platform"] = AMX
    assert AMX.int8_prior <= 1 < VNNI.int8_prior
    choice = first.planner.choice(corpus)
    assert not choice.calibrated and timed == []
    assert choice.measured == {"docs": 5000, "pays": False, "measured": False, "int8_prior": AMX.int8_prior}
    assert "weights_graph" not in first.planner.__dict__  # the int8-weights graph neither made nor timed
    assert first.planner.calibrated_graph is not None  # made, as `retr doctor --export` would
    later = BiEncoder(cfg)
    later.__dict__["platform"] = AMX
    measured = later.planner.choice(corpus)
    assert measured.calibrated and measured.measured["measured"] and sorted(timed) == ["openvino", "openvino-int8"]


def test_alternating_timing_puts_a_machines_drift_on_both_sides(monkeypatch):
    """Two equal runs on a machine that slows down run after run: timed one after the other, the second looks
    slower; in alternation, with the order reversed every other round, they come out equal."""
    clock = {"t": 0.0, "calls": 0}

    def run():  # each call takes longer than the one before it (a machine slowing down)
        clock["calls"] += 1
        clock["t"] += clock["calls"]

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    first = chooser.time_per_unit(run, 1, budget_s=0, min_rounds=4)
    second = chooser.time_per_unit(run, 1, budget_s=0, min_rounds=4)
    assert second > 1.5 * first  # one after the other: the drift reads as a difference
    a, b = chooser.time_alternating([run, run], 1, budget_s=0, min_rounds=4)
    assert a == b


def test_alternating_timing_stops_early_only_where_every_round_puts_the_same_run_far_ahead(monkeypatch):
    """With ``clear_ratio``, two runs each round far apart stop after ``min_rounds``; close runs, or one round
    that disagrees, take the whole budget as before; without it nothing changes."""
    clock = {"t": 0.0}

    def run_taking(seconds):
        def run():
            clock["t"] += seconds
        return run

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])

    def rounds(a, b, **kw) -> int:
        calls = []
        runs = [lambda: calls.append("a") or a(), lambda: calls.append("b") or b()]
        chooser.time_alternating(runs, 1, budget_s=20, min_rounds=2, **kw)
        return calls.count("a") - 1  # less the warm-up

    slow, fast = run_taking(2.0), run_taking(1.0)
    assert rounds(slow, fast, clear_ratio=1.5) == 2 and rounds(fast, slow, clear_ratio=1.5) == 2
    assert rounds(slow, fast) > 2  # not asked: the budget, as before
    assert rounds(run_taking(1.2), fast, clear_ratio=1.5) > 2  # close: the budget
    assert timing.settled([[2.0, 2.0], [1.0, 1.0]], 1.5) and timing.settled([[1.0, 1.0], [2.0, 2.0]], 1.5)
    assert not timing.settled([[2.0, 1.0], [1.0, 1.0]], 1.5)  # one round disagrees
    assert not timing.settled([[2.0], [1.0], [1.0]], 1.5) and not timing.settled([[], []], 1.5)


def test_where_queries_go_through_another_compiled_graph_the_documents_one_is_dropped_until_needed(tiny_bi_encoder,
                                                                                                    monkeypatch):
    """A search holds one compiled graph: once queries take the one-stream graph, the documents' two-stream
    compiled model is dropped, and compiled again when documents are encoded later (the same vectors)."""
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import ONE_STREAM, QueryGraphs

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    if enc.graph.runner.parallel < 2:
        pytest.skip("one core: the documents' graph runs one stream already")
    docs = ["wolves in the forest", "solar panels on roofs", "rivers between mountains"]
    before = enc.encode(docs)
    assert enc.graph.runner._compiled is not None
    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: 0.001 if g.runner.parallel == 1 else 0.004)
    assert enc.query_graph is enc.query_graphs.candidates[enc.graph.variant + ONE_STREAM]
    assert enc.graph.runner._compiled is None  # dropped
    q = enc.encode_queries(["wolves"])
    assert enc.graph.runner._compiled is None  # queries never compile it again
    np.testing.assert_allclose(enc.encode(docs), before, atol=1e-5)  # compiled again on use: the same vectors
    assert enc.graph.runner._compiled is not None and q.shape == (1, enc.dim)


@pytest.mark.skipif(not (platform_mod._platform.system() == "Linux" and platform_mod._platform.machine() == "x86_64"),
                    reason="the kernel's AMX grant is a Linux x86-64 request")
def test_benchmarks_without_amx_makes_the_kernel_refuse_amx_to_the_command_it_runs():
    import subprocess
    import sys
    from pathlib import Path
    launcher = Path(__file__).resolve().parents[1] / "benchmarks" / "without_amx.py"
    code = ("import ctypes; from retr.retrieval.backends.platform import amx_granted; "
            "libc = ctypes.CDLL(None, use_errno=True); r = libc.syscall(158, 0x1023, 18); "
            "print(r, ctypes.get_errno(), amx_granted())")
    out = subprocess.run([sys.executable, str(launcher), sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["-1", "1", "False"]  # EPERM from the filter, and retr reads the refusal


def test_bf16_is_taken_only_where_the_probe_measured_it_more_than_the_margin_faster(monkeypatch):
    from retr.retrieval.backends.precision import PrecisionTiming
    slow = PrecisionTiming(bf16_ms=19.8, fp32_ms=12.6)  # an AMX Xeon with AMX refused
    close = PrecisionTiming(bf16_ms=10.0, fp32_ms=10.5)  # within the margin: fp32 adds no noise
    fast = PrecisionTiming(bf16_ms=4.6, fp32_ms=11.7)  # AMX
    assert (slow.bf16_pays, close.bf16_pays, fast.bf16_pays) == (False, False, True)
    no_amx = replace(VNNI, precision_probe=slow)
    assert (no_amx.precision, no_amx.kind, no_amx.bf16_native) == ("fp32", "fp32+int8", True)
    assert no_amx.int8_prior > VNNI.int8_prior > 1  # int8 over an fp32 base graph gains more than over bf16
    assert replace(AMX, precision_probe=fast).precision == "bf16"
    assert replace(VNNI, precision_probe=slow, bf16_forced=True).precision == "bf16"  # RETR_BF16=1 overrides
    assert replace(AVX2, precision_probe=fast).precision == "fp32"  # never bf16 without the instructions
    assert no_amx.to_dict()["precision_probe"]["bf16_pays"] is False


def test_the_probe_runs_once_per_cpu_where_bf16_is_native_and_is_read_back_from_the_cache(monkeypatch, tmp_path):
    from retr.retrieval.backends import precision
    from retr.retrieval.backends.precision import PrecisionTiming
    monkeypatch.setenv("RETR_CACHE", str(tmp_path))
    monkeypatch.delenv("RETR_BF16", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(platform_mod, "amx_granted", lambda: True)
    measured = []
    monkeypatch.setattr(precision, "measure_apart",
                        lambda threads: measured.append(threads) or PrecisionTiming(20.0, 12.0))
    precision.timing.cache_clear()
    try:
        monkeypatch.setattr(platform_mod, "_cpuinfo", lambda: ("test CPU, no AMX", VNNI.flags))
        assert this_platform().precision == "fp32" and this_platform().precision == "fp32"
        assert measured == [VNNI.threads] and len(list((tmp_path / "choices").glob("precision-*.json"))) == 1
        precision.timing.cache_clear()  # another process, the same cache: read back, not measured
        assert this_platform().precision_probe == PrecisionTiming(20.0, 12.0) and len(measured) == 1
        monkeypatch.setattr(platform_mod, "_cpuinfo", lambda: ("test CPU, AVX2", AVX2.flags))
        assert this_platform().precision_probe is None and len(measured) == 1  # no bf16 here: nothing to measure
        monkeypatch.setattr(platform_mod, "_cpuinfo", lambda: ("test CPU, no AMX", VNNI.flags))
        monkeypatch.setenv("RETR_BF16", "1")
        assert this_platform().precision == "bf16" and len(measured) == 1  # forced: not measured
    finally:
        precision.timing.cache_clear()


def test_the_real_probe_times_both_precisions_of_one_openvino_model_in_a_child_process(monkeypatch):
    from retr.retrieval.backends import precision
    monkeypatch.setattr(precision, "measure", lambda threads: pytest.fail("measured in this process"))
    t = precision.measure_apart(threads=1)
    assert t.bf16_ms > 0 and t.fp32_ms > 0 and isinstance(t.bf16_pays, bool)


def test_a_less_noisy_candidate_within_the_margin_of_the_fastest_is_taken_over_it():
    """Two int8 query graphs about as fast (static int8 and int8 weights on an AVX-512 EPYC: 2.494 against 2.495
    ms): the one that adds less ranking noise, however close; beyond the margin, the faster."""
    margin = chooser.NOISE_FREE_MARGIN
    base = Timing("openvino:one-stream", 0.0036)
    static = Timing("openvino-int8:one-stream", 0.0025, rank_noise=0.0252)
    calm = chooser.choose(QUERIES, [base, static, Timing("openvino-int8w:one-stream", 0.0025 * (1 + margin) * 0.99,
                                                         rank_noise=0.0176)], "openvino")
    assert calm.backend == "openvino-int8w:one-stream" and "less ranking noise (0.0176 against 0.0252)" in calm.why
    slow = chooser.choose(QUERIES, [base, static, Timing("openvino-int8w:one-stream", 0.0025 * (1 + margin) * 1.01,
                                                         rank_noise=0.0176)], "openvino")
    assert slow.backend == "openvino-int8:one-stream" and "fastest of 3" in slow.why
    noisier = chooser.choose(QUERIES, [base, static, Timing("onnx-int8", 0.00249, rank_noise=0.0361)], "openvino")
    assert noisier.backend == "openvino-int8:one-stream"  # the fastest by a hair, noisier: not taken


def test_a_lone_text_is_padded_to_a_multiple_of_tokens_never_cut_nor_past_the_max_length():
    from retr.retrieval.backends.batching import lone_feed

    row = np.arange(1, 12)  # 11 tokens
    feed = lone_feed(row, 8, 512)
    assert feed["input_ids"].shape == (1, 16) and feed["attention_mask"].shape == (1, 16)
    assert feed["input_ids"][0, :11].tolist() == row.tolist() and feed["input_ids"][0, 11:].tolist() == [0] * 5
    assert feed["attention_mask"][0].tolist() == [1] * 11 + [0] * 5
    assert lone_feed(row, 8, 13)["input_ids"].shape == (1, 13)  # never past the max length
    assert lone_feed(row, 8, 5)["input_ids"].shape == (1, 11)  # nor cut (the tokenizer truncates, not this)
    assert lone_feed(np.arange(16), 8, 512)["input_ids"].shape == (1, 16)  # a multiple already
    assert lone_feed(row)["attention_mask"].tolist() == [[1] * 11]  # multiple 1: at its own length


def test_a_lone_query_through_an_openvino_graph_is_padded_and_keeps_its_vector(tiny_bi_encoder):
    """OpenVINO compiles kernels per sequence length and plans every node again when it changes: a query alone is
    padded to a multiple of 8 tokens (fewer lengths), its mask zero there, so its vector stays what it was. A
    graph whose vectors depend on their batch (dynamic int8: the padding would enter its activation scales) runs
    it at its own length."""
    from retr.retrieval.backends.graphs import lone_feed
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), backend="openvino"))
    texts = ["wolves in the forest at night", "wolves in the forest", "wolves at night", "the forest"]
    text, row = next((t, r) for t, r in zip(texts, enc.tokens.ids(texts), strict=True) if len(r) % 8)
    feed = lone_feed(enc.graph, row, enc.max_length)
    assert feed["input_ids"].shape[1] % 8 == 0 and feed["input_ids"].shape[1] > len(row)
    ids = np.asarray([row], dtype=np.int64)
    alone = enc.graph.runner({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    ran = []
    real = enc.graph.runner.__call__

    class Seen:  # the runner as the encoder calls it, recording each feed's width
        lone_multiple = enc.graph.runner.lone_multiple

        def __call__(self, feeds):
            ran.append(feeds["input_ids"].shape[1])
            return real(feeds)

    graph = replace(enc.graph, runner=Seen())
    enc.query_graphs.__dict__["graph"] = graph
    q = enc.encode_queries([text])
    assert ran == [feed["input_ids"].shape[1]]
    np.testing.assert_allclose(q, alone, atol=2e-3)
    unmasked = real({"input_ids": feed["input_ids"], "attention_mask": np.ones_like(feed["input_ids"])})
    assert np.abs(unmasked - alone).max() > 10 * np.abs(q - alone).max()  # the mask is what keeps it
    dynamic = replace(enc.graph, backend=registry.BACKENDS["onnx-int8"])
    assert lone_feed(dynamic, row, enc.max_length)["input_ids"].shape[1] == len(row)


def test_the_models_static_int8_graph_is_a_query_candidate_once_calibrated_as_one_stream(tiny_bi_encoder,
                                                                                          monkeypatch):
    """Calibrated once per model on retr's fixed sample (not on a corpus), the static int8 graph costs a query
    nothing more to offer once a corpus has paid for it: a candidate as one stream over every core, timed and
    checked for ranking noise like any other, and taken where it is fastest (fake timings here)."""
    import os

    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.query_graphs import QueryGraphs

    monkeypatch.setenv("RETR_INT8_DOT", "1")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # two streams to make one of, on any host
    cfg = EncoderConfig(model=str(tiny_bi_encoder))
    enc = BiEncoder(cfg)
    assert list(enc.query_graphs.candidates) == ["openvino", "openvino:one-stream"]  # nothing calibrated yet
    calibrated = enc.exported.open("openvino-int8", enc.planner.calibration, base=enc.graph)
    speeds = {("openvino", 2): 0.004, ("openvino", 1): 0.003, ("openvino-int8", 1): 0.001}
    monkeypatch.setattr(QueryGraphs, "seconds", lambda self, g: speeds[g.variant, g.runner.parallel])
    fresh = BiEncoder(cfg)
    single = fresh.query_graphs.candidates["openvino-int8:one-stream"]
    assert (single.path, single.calibration, single.runner.parallel) == (calibrated.path, calibrated.calibration, 1)
    assert fresh.query_graph is single
    chosen = fresh.describe_queries()["chosen"]
    noise = {c["backend"]: c.get("rank_noise") for c in chosen["candidates"]}
    assert chosen["backend"] == "openvino-int8:one-stream" and 0 <= noise["openvino-int8:one-stream"] < 0.05
    assert noise["openvino:one-stream"] is None  # the documents' own file and precision: nothing to check
    speeds[("openvino-int8", 1)] = 0.0035  # slower than the base graph as one stream: not taken
    monkeypatch.setattr(QueryGraphs, "key", lambda self: "another machine")
    assert BiEncoder(cfg).query_graph.variant == "openvino"

