"""The cross-encoder's graph is measured on the machine (issue 39): among its graphs already in the cache, the
fastest at one query's pairs at the rerank depth that stays within the ranking-noise bound; stored, then read."""

from __future__ import annotations

import numpy as np
import pytest

from retr.retrieval.backends import chooser
from retr.retrieval.backends.export import pair_noise
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import CE_MAX_RANK_NOISE
from retr.retrieval.rerank_graphs import PairGraphs, sample_pairs
from retr.retrieval.rerank_model import CrossEncoderReranker, RerankConfig


def _reranker(model, **options) -> CrossEncoderReranker:
    return CrossEncoderReranker(RerankConfig(model=str(model), max_length=64, corpus_check=False, **options))


def _fake_speeds(monkeypatch, ms: dict[str, float], noise: dict[str, float] | None = None):
    calls = []

    def seconds(self, graph):
        calls.append(graph.variant)
        return ms[graph.variant] / 1000

    monkeypatch.setattr(PairGraphs, "seconds", seconds)
    if noise is not None:
        monkeypatch.setattr(PairGraphs, "noise", lambda self, graph: noise[graph.variant])
    return calls


def test_sample_pairs_are_a_query_at_the_depth():
    pairs = sample_pairs(20, 3)
    assert len(pairs) == 3 and all(len(d) == 20 for _, d in pairs)
    assert pairs[0][1][0] != pairs[1][1][0]  # each question starts at its own passage
    assert pair_noise([np.array([1.0, 2.0, 3.0])], [np.array([1.0, 2.0, 3.0])]) == 0.0
    assert pair_noise([np.array([1.0, 2.0, 3.0])], [np.array([1.0, 2.5, 3.0])]) > 0.1


def test_one_candidate_is_not_timed(tiny_cross_encoder, monkeypatch):
    calls = _fake_speeds(monkeypatch, {"openvino": 1.0})
    r = _reranker(tiny_cross_encoder)
    assert r.backend == "openvino" and r.choice is None and "chosen" not in r.describe()
    assert calls == []


def test_the_fastest_cached_graph_that_passes_is_chosen_then_read_back(tiny_cross_encoder, monkeypatch):
    _reranker(tiny_cross_encoder, backend="onnx")  # made (and verified) now: a second candidate in the cache
    calls = _fake_speeds(monkeypatch, {"openvino": 9.0, "onnx": 3.0}, {"onnx": 0.01})
    r = _reranker(tiny_cross_encoder)
    assert r.backend == "onnx" and r.choice is not None and r.choice.role == chooser.PAIRS
    assert sorted(calls) == ["onnx", "openvino"]
    chosen = r.describe()["chosen"]
    assert chosen["backend"] == "onnx" and {c["backend"] for c in chosen["candidates"]} == {"openvino", "onnx"}
    # a later run reads the stored choice: nothing is timed again
    calls.clear()
    again = _reranker(tiny_cross_encoder)
    assert again.backend == "onnx" and calls == [] and not again.choice.measured
    # another depth: another choice, timed again
    _reranker(tiny_cross_encoder, depth=7)
    assert calls


def test_a_candidate_over_the_noise_bound_is_never_chosen(tiny_cross_encoder, monkeypatch):
    _reranker(tiny_cross_encoder, backend="onnx")
    _fake_speeds(monkeypatch, {"openvino": 9.0, "onnx": 1.0}, {"onnx": 5.0})
    r = _reranker(tiny_cross_encoder)
    assert r.backend == "openvino"
    failed = [t for t in r.choice.timings if not t.passed]
    assert [t.backend for t in failed] == ["onnx"] and "ranking noise" in failed[0].why


def test_a_given_backend_is_not_second_guessed(tiny_cross_encoder, monkeypatch):
    _reranker(tiny_cross_encoder, backend="onnx")
    calls = _fake_speeds(monkeypatch, {"openvino": 1.0, "onnx": 9.0})
    r = _reranker(tiny_cross_encoder, backend="onnx")
    assert r.backend == "onnx" and r.choice is None and calls == []


def test_real_timing_and_noise_of_two_graphs(tiny_cross_encoder):
    """Unpatched: both candidates timed for real and the onnx graph's noise against openvino's measured (the random
    tiny model's scores barely spread, so its ratio says little: only that it is measured and decides)."""
    _reranker(tiny_cross_encoder, backend="onnx")
    r = _reranker(tiny_cross_encoder)
    timings = {t.backend: t for t in r.choice.timings}
    assert set(timings) == {"openvino", "onnx"} and all(t.seconds > 0 for t in timings.values())
    assert timings["onnx"].rank_noise is not None and timings["onnx"].passed == (timings["onnx"].rank_noise <= CE_MAX_RANK_NOISE)
    assert r.backend == min((t for t in timings.values() if t.passed), key=lambda t: t.seconds).backend


@pytest.mark.parametrize("flags,int8_kept", [({"avx2"}, False), ({"avx2", "avx512_vnni"}, True)])
def test_static_int8_pairs_are_candidates_only_where_int8_runs(flags, int8_kept):
    """Pruning as an AVX2-only and a VNNI CPU would: the static int8 graph is never a candidate on the first."""
    from retr.retrieval.backends.registry import BACKENDS

    kept, pruned = chooser.prune(Platform.of(flags), [BACKENDS["openvino-int8"], BACKENDS["onnx"]])
    assert ("openvino-int8" in [b.name for b in kept]) is int8_kept
    assert "onnx" in [b.name for b in kept]
    assert (dict(pruned).get("openvino-int8") is None) is int8_kept
