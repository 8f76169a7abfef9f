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

    def seconds(self, graph, *args, **timing):
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
    tiny model's scores barely spread, so its ratio says little: only that it is measured and decides). Which graph
    a real timing picks is the machine's business: the rule is tested with injected timings above."""
    _reranker(tiny_cross_encoder, backend="onnx")
    r = _reranker(tiny_cross_encoder)
    timings = {t.backend: t for t in r.choice.timings}
    assert set(timings) == {"openvino", "onnx"} and all(t.seconds > 0 for t in timings.values())
    assert timings["onnx"].rank_noise is not None and timings["onnx"].passed == (timings["onnx"].rank_noise <= CE_MAX_RANK_NOISE)
    assert r.backend in {b for b, t in timings.items() if t.passed} and r.describe()["chosen"]["backend"] == r.backend


@pytest.mark.parametrize("flags,int8_kept", [({"avx2"}, False), ({"avx2", "avx512_vnni"}, True)])
def test_static_int8_pairs_are_candidates_only_where_int8_runs(flags, int8_kept):
    """Pruning as an AVX2-only and a VNNI CPU would: the static int8 graph is never a candidate on the first."""
    from retr.retrieval.backends.registry import BACKENDS

    kept, pruned = chooser.prune(Platform.of(flags), [BACKENDS["openvino-int8"], BACKENDS["onnx"]])
    assert ("openvino-int8" in [b.name for b in kept]) is int8_kept
    assert "onnx" in [b.name for b in kept]
    assert (dict(pruned).get("openvino-int8") is None) is int8_kept


VNNI = Platform.of({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, cpu="AMD EPYC (simulated)")  # int8 prior 1.44
AVX2 = Platform.of({"avx", "avx2", "fma"}, cpu="AVX2 only (simulated)")


def _on(monkeypatch, platform: Platform) -> None:
    import retr.retrieval.rerank_model as rerank_model

    monkeypatch.setattr(rerank_model, "this_platform", lambda: platform)


def _noise_bound_lifted(monkeypatch) -> None:
    """A random tiny cross-encoder's static int8 graph adds ranking noise ~5 (a trained one: ~0.12): here its bound
    is lifted, so that the graph made is kept and becomes a candidate."""
    from dataclasses import replace
    from types import MappingProxyType

    import retr.retrieval.rerank_graphs as rerank_graphs
    from retr.retrieval.backends import registry

    loose = dict(registry.BACKENDS)
    loose["openvino-int8"] = replace(loose["openvino-int8"], max_rank_noise={"bi": 0.05, "ce": 100.0},
                                     floors={"bi": 0.98, "ce": 0.0})
    for module in (registry, rerank_graphs):
        monkeypatch.setattr(module, "BACKENDS", MappingProxyType(loose))
    monkeypatch.setattr(rerank_graphs.PairGraphs, "bar", 100.0)


def _static_folder(reranker) -> bool:
    """Whether the model's static int8 cross-encoder graph was made (kept, or refused and recorded)."""
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.graphs import cache_folder
    from retr.retrieval.backends.registry import BACKENDS

    return cache_folder(cache_home(), reranker.model_hash, BACKENDS["openvino-int8"], reranker.exported.kind,
                        reranker._calibration()).is_dir()


def test_a_run_whose_queries_repay_it_makes_the_static_int8_graph_and_chooses_again(tiny_cross_encoder,
                                                                                     monkeypatch):
    """Told how many queries it will rerank, a reranker whose graph is measured here makes the model's static int8
    graph first where they would save more than making it costs (the base graph timed: 9 ms a query's pairs;
    static int8 at the platform's prior, 1.44x; ~16.5 s to make): 10,000 queries save ~27 s. It is then among the
    candidates timed, checked and chosen; the report records what was weighed."""
    _on(monkeypatch, VNNI)
    _noise_bound_lifted(monkeypatch)  # in this process: the graph is made here, not in a child
    monkeypatch.setattr(CrossEncoderReranker, "_make_apart", lambda self, b: self.exported.open(b, self._calibration()))
    calls = _fake_speeds(monkeypatch, {"openvino": 9.0, "openvino-int8": 3.0}, {"openvino-int8": 0.01})
    r = _reranker(tiny_cross_encoder)
    assert r.backend == "openvino" and calls == []  # one candidate: nothing timed
    weighed = r.expect(10_000)
    assert weighed.pays and weighed.base_s == pytest.approx(0.009) and weighed.saving_s > weighed.calibration_s
    assert _static_folder(r) and "openvino-int8" in r.pair_graphs.candidates  # made now, and a candidate
    assert r.backend == "openvino-int8" and r.choice.role == chooser.PAIRS and sorted(calls) == [
        "openvino", "openvino", "openvino-int8"]  # weighed, then both timed: the faster chosen
    record = r.describe()["static_int8_weighed"]
    assert record["queries"] == 10_000 and record["pays"] and record["base_ms_per_query"] == pytest.approx(9.0)
    calls.clear()
    assert r.expect(10_000) is None and calls == []  # made already: nothing weighed again


def test_a_run_too_short_to_repay_it_makes_nothing(tiny_cross_encoder, monkeypatch):
    """100 queries save ~0.3 s through static int8, far less than making it: nothing is made, the base graph
    stays; with a backend named, or without int8 dot products, nothing is weighed at all."""
    _on(monkeypatch, VNNI)
    calls = _fake_speeds(monkeypatch, {"openvino": 9.0})
    r = _reranker(tiny_cross_encoder)
    weighed = r.expect(100)
    assert weighed is not None and not weighed.pays and not _static_folder(r) and r.backend == "openvino"
    assert r.describe()["static_int8_weighed"]["pays"] is False and calls == ["openvino"]
    calls.clear()
    again = _reranker(tiny_cross_encoder).expect(100)  # the next run reads the stored timing: nothing timed
    assert again.base_s == pytest.approx(weighed.base_s) and not again.pays and calls == []
    assert _reranker(tiny_cross_encoder, backend="openvino").expect(10 ** 6) is None
    _on(monkeypatch, AVX2)
    assert _reranker(tiny_cross_encoder).expect(10 ** 6) is None
    assert calls == [] and not _static_folder(r)


def test_a_static_int8_graph_refused_when_made_leaves_the_base_graph_and_is_never_weighed_again(
        tiny_cross_encoder, monkeypatch, caplog):
    """A random tiny cross-encoder's static int8 graph fails its ranking-noise check when made: a warning, the
    pairs stay on the base graph, and the refusal (recorded in the cache) is not weighed again."""
    _on(monkeypatch, VNNI)
    calls = _fake_speeds(monkeypatch, {"openvino": 9.0})
    r = _reranker(tiny_cross_encoder)
    with caplog.at_level("WARNING", logger="retr"):
        assert r.expect(10_000).pays
    assert r.backend == "openvino" and any("refused" in m.getMessage() for m in caplog.records)
    calls.clear()
    assert _reranker(tiny_cross_encoder).expect(10_000) is None and calls == []


def test_an_eval_tells_its_reranker_how_many_queries_its_rerank_pipelines_will_rerank(monkeypatch):
    from retr.eval.runner import EvalConfig
    from retr.eval.runner import _reranker as eval_reranker
    from retr.retrieval.pipeline import parse

    told = []
    monkeypatch.setattr(CrossEncoderReranker, "__init__", lambda self, cfg: None)
    monkeypatch.setattr(CrossEncoderReranker, "expect", lambda self, n: told.append(n))
    cfg = EvalConfig(pipelines=tuple(parse(p) for p in ("bm25", "hybrid+rerank", "dense+rerank")),
                     reranker=RerankConfig(model="unused"))
    assert isinstance(eval_reranker(cfg, 300), CrossEncoderReranker) and told == [600]
    assert eval_reranker(EvalConfig(pipelines=(parse("hybrid"),)), 300) is None and told == [600]


def test_a_graph_made_apart_is_made_in_a_child_into_the_cache_and_its_refusal_raised_here(tiny_cross_encoder,
                                                                                          capfd, caplog):
    """``_make_apart`` makes a graph in a child process (its torch export's memory handed back when it ends): the
    graph is then in the cache for this process, the child's log records are logged here (by the logger that made
    them), and a refusal there is a ``RetrError`` here."""
    from retr.retrieval.errors import RetrError

    r = _reranker(tiny_cross_encoder)
    assert r.exported.find("onnx") is None
    caplog.set_level("INFO", logger="retr")  # the child logs at this process's level
    r._make_apart("onnx")
    assert r.exported.find("onnx") is not None
    assert any("exporting cross-encoder" in m.getMessage() and m.name.startswith("retr.")
               for m in caplog.records), [m.getMessage() for m in caplog.records]
    assert "retr-log" not in capfd.readouterr().err  # relayed, never passed through as the child's own lines
    with pytest.raises(RetrError, match="ranking noise"):  # a random model's static int8: too noisy
        r._make_apart("openvino-int8")
