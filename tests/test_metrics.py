"""Metrics against pytrec_eval (per query, exact) and BEIR's EvaluateRetrieval (mean, rounded)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import pytrec_eval

from retr.eval.metrics import evaluate, ndcg_at_k
from retr.retrieval.types import Qrels, Run

K = [1, 3, 5, 10, 100]

# hand-written graded qrels, with a judged-non-relevant doc, a query with no relevant doc,
# a query the run does not answer and a run query without judgements
QRELS = {
    "q1": {"a": 3, "b": 0, "c": 1, "e": 2},
    "q2": {"x": 0},
    "q3": {"y": 1, "z": 2},
    "q4": {"m": 1},
    "q6": {"s": 1},
}
RUN = {
    "q1": {"a": 1.0, "b": 1.0, "c": 0.5, "d": 1.0, "e": 0.1, "f": 0.7},  # ties broken by doc id desc
    "q2": {"x": 1.0, "w": 0.3},
    "q3": {"z": 0.2, "n": 0.9, "y": 0.2},
    "q5": {"a": 1.0},
    "q6": {},
}


def _pytrec(qrels, run, ks):
    measures = {f"ndcg_cut.{','.join(map(str, ks))}", f"map_cut.{','.join(map(str, ks))}",
                f"recall.{','.join(map(str, ks))}", f"P.{','.join(map(str, ks))}", "recip_rank"}
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


def _compare(qrels: dict, run: dict, ks: list[int]) -> int:
    ref = _pytrec(qrels, run, ks)
    # MRR@10 = trec_eval's recip_rank on the ranking cut at 10
    cut10 = {q: dict(Run.from_dict({q: d}).top(10).to_dict()[q]) for q, d in run.items()}
    ref10 = _pytrec(qrels, cut10, ks)
    ours = evaluate(Run.from_dict(run), Qrels(qrels), ks)
    assert set(ours.per_query) == set(ref), (set(ours.per_query), set(ref))
    checked = 0
    for q, vals in ref.items():
        for k in ks:
            for ours_name, ref_name in (("NDCG", "ndcg_cut"), ("MAP", "map_cut"), ("Recall", "recall"), ("P", "P")):
                assert math.isclose(ours.per_query[q][f"{ours_name}@{k}"], vals[f"{ref_name}_{k}"],
                                    rel_tol=1e-12, abs_tol=1e-12), (q, ours_name, k)
                checked += 1
        assert math.isclose(ours.per_query[q]["MRR@10"], ref10[q]["recip_rank"], abs_tol=1e-12)
    return checked


def test_hand_written_graded_qrels_match_pytrec_eval():
    assert _compare(QRELS, RUN, K) == 4 * 4 * len(K)


def test_hand_computed_ndcg_with_grades_as_gains():
    # q1 in trec order: d(1.0) b(1.0) a(1.0) f(0.7) c(0.5) e(0.1) -> gains 0,0,3,0,1,2
    dcg = 3 / math.log2(4) + 1 / math.log2(6) + 2 / math.log2(7)
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    ours = evaluate(Run.from_dict(RUN), Qrels(QRELS), [10]).per_query["q1"]["NDCG@10"]
    assert ours == pytest.approx(dcg / idcg, abs=1e-15)
    assert ndcg_at_k([], {"a": 1}, 10) == 0.0


def test_scored_query_set_is_run_and_qrels_intersection():
    ev = evaluate(Run.from_dict(RUN), Qrels(QRELS), K)
    assert set(ev.per_query) == {"q1", "q2", "q3", "q6"}  # q4 unanswered, q5 unjudged
    assert ev.per_query["q6"]["NDCG@10"] == 0.0  # empty ranking still scored, as 0
    assert ev.num_queries == 4


def test_random_runs_match_pytrec_eval():
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(40)]
    qrels, run = {}, {}
    for q in range(25):
        qid = f"q{q}"
        qrels[qid] = {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 8))}
        # coarse scores so that ties are common
        run[qid] = {d: rng.randint(0, 5) / 5 for d in rng.sample(docs, rng.randint(0, 30))}
    assert _compare(qrels, run, [1, 2, 5, 10, 20]) > 0


def test_mean_equals_beir_evaluate_retrieval_and_inputs_unchanged():
    from beir.retrieval.evaluation import EvaluateRetrieval

    run = Run.from_dict(RUN)
    qrels = Qrels(QRELS)
    before = (run.to_dict(), qrels.to_dict())
    ours = evaluate(run, qrels, K).mean
    assert (run.to_dict(), qrels.to_dict()) == before
    ndcg, _map, rec, prec = EvaluateRetrieval.evaluate(QRELS, run.to_dict(), K, ignore_identical_ids=False)
    # BEIR's MRR needs every run query judged and divides by len(qrels): give it the common queries,
    # which is what `retr eval` always has (every judged query is run)
    common = set(QRELS) & set(RUN)
    # (BEIR's MRR breaks score ties by dict order; a Run's order is trec_eval's, as in our run files)
    mrr = EvaluateRetrieval.evaluate_custom({q: QRELS[q] for q in common}, {q: run.to_dict()[q] for q in common},
                                            [10], metric="mrr")
    for name, value in {**ndcg, **_map, **rec, **prec, **mrr}.items():
        assert round(ours[name], 5) == value, name
    # evaluation never rounds
    assert any(round(v, 5) != v for v in ours.values())


def test_ignore_identical_ids_like_beir():
    from beir.retrieval.evaluation import EvaluateRetrieval

    qrels = {"1": {"1": 1, "2": 1}, "2": {"3": 1}}
    run = {"1": {"1": 0.9, "2": 0.5, "7": 0.4}, "2": {"2": 0.9, "3": 0.1}}
    ours = evaluate(Run.from_dict(run), Qrels(qrels), [1, 3], ignore_identical_ids=True).mean
    plain = evaluate(Run.from_dict(run), Qrels(qrels), [1, 3], ignore_identical_ids=False).mean
    ndcg, *_ = EvaluateRetrieval.evaluate(qrels, {q: dict(d) for q, d in run.items()}, [1, 3],
                                          ignore_identical_ids=True)
    assert round(ours["NDCG@3"], 5) == ndcg["NDCG@3"]
    assert ours["NDCG@1"] != plain["NDCG@1"]


def test_run_rejects_duplicates_and_keeps_its_own_copy_in_trec_order():
    from retr.retrieval.errors import RetrError

    with pytest.raises(RetrError, match="lists a document twice"):
        Run({"q": [("a", 1.0), ("a", 0.5)]})
    source = {"q": {"a": 1.0, "c": 2.0, "b": 2.0}}
    run = Run.from_dict(source)
    source["q"]["z"] = 9.0  # the caller's dict changes afterwards: the run does not
    assert [h.doc_id for h in run["q"]] == ["c", "b", "a"]  # score descending, ties by doc id descending
    assert run.top(1).to_dict() == {"q": {"c": 2.0}} and len(run["q"]) == 3


def test_one_pass_metrics_equal_the_small_pure_functions():
    from retr.eval.metrics import (
        _query_metrics,
        average_precision_at_k,
        precision_at_k,
        recall_at_k,
        reciprocal_rank_at_k,
    )

    rng = random.Random(3)
    docs = [f"d{i}" for i in range(30)]
    for _ in range(50):
        grades = {d: rng.choice([0, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 10))}
        ranked = rng.sample(docs, rng.randint(0, 25))
        ks = sorted(rng.sample(range(1, 40), 4))
        got = _query_metrics(ranked, grades, ks)
        for k in ks:
            assert got[f"NDCG@{k}"] == pytest.approx(ndcg_at_k(ranked, grades, k), abs=1e-12)
            assert got[f"MAP@{k}"] == pytest.approx(average_precision_at_k(ranked, grades, k), abs=1e-12)
            assert got[f"Recall@{k}"] == pytest.approx(recall_at_k(ranked, grades, k), abs=1e-12)
            assert got[f"P@{k}"] == pytest.approx(precision_at_k(ranked, grades, k), abs=1e-12)
        assert got["MRR@10"] == pytest.approx(reciprocal_rank_at_k(ranked, grades, 10), abs=1e-12)


def test_percentiles_match_numpy_and_hand_values():
    from retr.eval.report import Percentiles

    p = Percentiles.of([1.0, 2.0, 3.0, 4.0])
    assert (p.p50, p.mean, p.n) == (2.5, 2.5, 4)
    assert p.p95 == pytest.approx(float(np.percentile([1, 2, 3, 4], 95))) and p.p99 <= 4.0
    empty = Percentiles.of([])
    assert empty.n == 0 and np.isnan(empty.p50)


def _report(**over):
    from retr.eval.report import DatasetInfo, EvalReport, Percentiles, PipelineResult

    lat = {"bm25": Percentiles.of([0.5, 1.5]), "total": Percentiles.of([1.0, 3.0])}
    p = PipelineResult(name="bm25", metrics={**{f"{m}@{k}": 0.5 for m in ("NDCG", "MAP", "Recall", "P")
                                                for k in (1, 10, 100)}, "MRR@10": 0.25},
                       per_query={"q1": {"NDCG@10": 0.5}}, latency_ms=lat, per_query_latency_ms={"q1": {"total": 1.0}},
                       num_queries_scored=2, qps=500.0, wall_seconds=0.1, build_seconds=0.2, index_bytes=2_500_000,
                       docs_per_second=80.0)
    return EvalReport(dataset=DatasetInfo("tiny", "/x", "test", 16, 2), k_values=[1, 10, 100],
                      ignore_identical_ids=False, pipelines={"bm25": p}, index={}, reranker=None, config={},
                      environment={}, **over)


def test_tables_show_the_headline_metrics_latency_and_cost():
    from retr.eval.table import detail_table, main_table

    report = _report()
    text = main_table(report)
    lines = text.splitlines()
    assert lines[0] == "tiny (test): 16 docs, 2 queries scored; latency per single warm query"
    assert lines[1].split() == ["pipeline", "NDCG@10", "MAP@10", "Recall@100", "P@10", "MRR@10", "p50", "ms", "p95",
                                "ms", "p99", "ms", "QPS", "bm25", "p50", "build", "s", "docs/s", "index", "MB"]
    assert lines[3].split() == ["bm25", "0.5000", "0.5000", "0.5000", "0.5000", "0.2500", "2.00", "2.90", "2.98",
                                "500.0", "1.00", "0.2", "80.0", "2.50"]
    detail = detail_table(report).splitlines()
    assert detail[0].split() == ["pipeline", "metric", "@1", "@10", "@100"] and len(detail) == 2 + 4


def test_report_round_trips_and_refuses_what_is_not_a_report(tmp_path):
    from retr.eval.report import EvalReport
    from retr.retrieval.errors import RetrError

    report = _report(total_seconds=1.5)
    report.write(tmp_path / "r.json")
    assert EvalReport.read(tmp_path / "r.json") == report
    (tmp_path / "bad.json").write_text('{"pipelines": {}}')
    with pytest.raises(RetrError, match="bad.json: not a retr eval report"):
        EvalReport.read(tmp_path / "bad.json")
