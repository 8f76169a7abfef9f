"""`retr eval` over several datasets and `retr compare`: the statistics equal scipy's, the multiple-comparison
correction is Holm's, and the command line reads reports, suites and TREC run files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats as st

from retr.cli.main import main
from retr.eval.compare import System, compare
from retr.eval.report import EvalSuite, read_reports
from retr.eval.stats import bootstrap_ci, holm, paired_t_test, randomization_test

from .conftest import DOCS, QRELS, QUERIES, write_beir


def _pair(n: int, shift: float, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.random(n)
    return a, np.clip(a + rng.normal(shift, 0.15, n), 0, 1)


@pytest.mark.parametrize("n,shift,seed", [(8, 0.1, 0), (12, 0.0, 1), (40, 0.05, 2), (300, 0.01, 3)])
def test_paired_t_test_equals_scipy(n, shift, seed):
    a, b = _pair(n, shift, seed)
    t, p = paired_t_test(a, b)
    ref = st.ttest_rel(b, a)
    assert t == pytest.approx(float(ref.statistic), rel=1e-12) and p == pytest.approx(float(ref.pvalue), rel=1e-10)


@pytest.mark.parametrize("n,shift,seed", [(6, 0.1, 0), (10, 0.05, 1), (13, 0.0, 2)])
def test_exact_randomization_test_equals_scipy(n, shift, seed):
    a, b = _pair(n, shift, seed)
    ref = st.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                              permutation_type="samples", n_resamples=10_000)
    assert randomization_test(a, b, 10_000) == pytest.approx(float(ref.pvalue), abs=1e-12)


def test_sampled_randomization_test_agrees_with_scipy_within_resampling_error():
    a, b = _pair(300, 0.012, 4)
    ours = randomization_test(a, b, 20_000, seed=0)
    ref = st.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                              permutation_type="samples", n_resamples=20_000, rng=0).pvalue
    assert 0.001 < ref < 0.5 and ours == pytest.approx(float(ref), abs=0.01)
    assert randomization_test(a, b, 20_000, seed=0) == ours  # seeded: the same p every time


def test_bootstrap_interval_agrees_with_scipy_percentile():
    a, b = _pair(200, 0.1, 5)
    diff, lo, hi = bootstrap_ci(a, b, np.median, 10_000, seed=0)
    ref = st.bootstrap((b, a), lambda x, y, axis: np.median(x, axis=axis) - np.median(y, axis=axis), paired=True,
                       method="percentile", n_resamples=10_000, rng=0).confidence_interval
    assert diff == pytest.approx(float(np.median(b) - np.median(a)))
    assert lo == pytest.approx(ref.low, abs=0.01) and hi == pytest.approx(ref.high, abs=0.01) and lo < diff < hi


def test_holm_bonferroni_by_hand_and_degenerate_tests():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 -> 0.02, 0.03, 0.06, 0.04 -> monotone: 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, float("nan"), 0.9])[0] == pytest.approx(1.0)
    assert paired_t_test([0.5, 0.5], [0.5, 0.5]) == (0.0, 1.0)
    assert randomization_test([0.2] * 5, [0.2] * 5) == 1.0


def test_compare_corrects_across_everything_compared():
    a, b = _pair(30, 0.08, 6)
    _, c = _pair(30, 0.0, 7)
    per = lambda v: {f"q{i}": {"NDCG@10": float(x), "Recall@100": float(x)} for i, x in enumerate(v)}  # noqa: E731
    systems = [System("A", "d1", per(a)), System("B", "d1", per(b)), System("C", "d1", per(c)),
               System("A2", "d2", per(a)), System("B2", "d2", per(b))]
    result = compare(systems, ("NDCG@10", "Recall@100"), 2000, 0)
    assert len(result.metrics) == 6  # (B, C vs A) x 2 metrics on d1, B2 vs A2 x 2 metrics on d2
    raw = [r.p_t for r in result.metrics]
    assert [r.p_t_holm for r in result.metrics] == pytest.approx(holm(raw))
    first = result.metrics[0]
    assert first.p_t == pytest.approx(st.ttest_rel(b, a).pvalue)
    assert (first.wins, first.ties, first.losses) == (int((b > a).sum()), int((b == a).sum()), int((b < a).sum()))
    assert first.difference == pytest.approx(float((b - a).mean()))


def test_eval_over_two_datasets_then_compare(tiny_bi_encoder, tmp_path, capsys):
    one = write_beir(tmp_path / "alpha")
    two = write_beir(tmp_path / "beta", docs=DOCS[:12], queries={q: QUERIES[q] for q in ("q2", "q3", "q4", "q5")},
                     qrels={q: QRELS[q] for q in ("q2", "q3", "q4", "q5")})
    listing = tmp_path / "sets.txt"
    listing.write_text(f"# two sets\n{one}\n\n{two}\n")
    suite = tmp_path / "suite.json"
    assert main(["eval", "--dataset", str(listing), "--model", str(tiny_bi_encoder), "--backend", "onnx",
                 "--pipelines", "bm25,dense,hybrid", "--k-values", "1,10,100", "--warmup", "1",
                 "--out", str(suite)]) == 0
    out = capsys.readouterr().out
    assert "NDCG@10 across 2 datasets" in out and "Recall@100 across 2 datasets" in out and "mean" in out
    reports = read_reports(suite)
    assert [r.dataset.name for r in reports] == ["alpha", "beta"]
    assert (tmp_path / "suite-runs" / "beta" / "dense.trec").is_file() or any((tmp_path / "suite-runs").rglob("*"))
    EvalSuite(reports).write(tmp_path / "again.json")
    assert read_reports(tmp_path / "again.json") == reports

    assert main(["compare", str(suite), "--resamples", "2000", "--out", str(tmp_path / "cmp.json")]) == 0
    text = capsys.readouterr().out
    assert "suite:dense" in text and "95% bootstrap CI" in text
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert {r["dataset"] for r in cmp["metrics"]} == {"alpha", "beta"} and len(cmp["latency"]) == 4
    alpha_dense = next(r for r in cmp["metrics"] if r["dataset"] == "alpha" and r["system"] == "suite:dense"
                       and r["metric"] == "NDCG@10")
    bm25 = reports[0].pipelines["bm25"].per_query
    dense = reports[0].pipelines["dense"].per_query
    qs = sorted(bm25)
    a = [bm25[q]["NDCG@10"] for q in qs]
    b = [dense[q]["NDCG@10"] for q in qs]
    want = st.ttest_rel(b, a).pvalue if np.std(np.subtract(b, a)) > 0 else 1.0
    assert alpha_dense["p_t"] == pytest.approx(float(want), nan_ok=True)

    # a second report of one of the two collections: only its pipeline against the first's of the same name, on
    # that collection; the other collection and the first report's pipelines among themselves are not compared,
    # and latency across the two runs is shown, never tested
    single = tmp_path / "rrf.json"
    assert main(["eval", "--dataset", str(one), "--model", str(tiny_bi_encoder), "--backend", "onnx",
                 "--pipelines", "hybrid", "--fusion", "rrf", "--k-values", "1,10,100", "--warmup", "1",
                 "--out", str(single)]) == 0
    capsys.readouterr()
    assert main(["compare", str(suite), str(single), "--resamples", "200", "--out", str(tmp_path / "ab.json")]) == 0
    text = capsys.readouterr().out
    ab = json.loads((tmp_path / "ab.json").read_text())
    assert [(r["dataset"], r["baseline"], r["system"]) for r in ab["metrics"]] == [
        ("alpha", "suite:hybrid", "rrf:hybrid")] * 2
    assert ab["unpaired"] == ["beta"] and "not compared (in one file only): beta" in text
    assert [(x["baseline"], x["system"], x["ci_low_ms"]) for x in ab["latency"]] == [("suite:hybrid", "rrf:hybrid",
                                                                                       None)]
    assert "other run" in text and "never tested" in text
    header = text.splitlines()[0].split()
    assert header[-1] == "both<0.05" and "suite:dense" not in text


def test_compare_trec_runs_and_bad_input(tmp_path, capsys):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, ds in QRELS.items()
                                                             for d, g in ds.items()))
    good, bad = tmp_path / "good.trec", tmp_path / "bad.trec"
    good.write_text("".join(f"{q} Q0 {d} {r} {10 - r} x\n" for q, ds in QRELS.items()
                            for r, d in enumerate(sorted(ds, key=lambda d: -ds[d]), start=1)))
    bad.write_text("".join(f"{q} Q0 d6 1 1 x\n" for q in QRELS))
    assert main(["compare", str(bad), str(good), "--qrels", str(qrels), "--metrics", "NDCG@10"]) == 0
    assert "good" in capsys.readouterr().out
    assert main(["compare", str(bad), str(good)]) == 2
    assert "needs --qrels" in capsys.readouterr().err
    assert main(["compare", str(good), "--qrels", str(qrels)]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert main(["compare", str(bad), str(good), "--qrels", str(qrels), "--metrics", "NOPE@3"]) == 2
    assert "metric 'NOPE@3'" in capsys.readouterr().err


def test_pipelines_of_two_reports_are_compared_name_with_name():
    """`retr compare base.json new.json`: base's hybrid against new's hybrid, bm25 against bm25 (not everything
    against base's first pipeline); a pipeline base lacks against base's first; one report alone: every pipeline
    against its first."""
    from retr.eval.compare import pairs

    def sys(file, name):
        return System(f"{file}:{name}", "d", {}, pipeline=name, source=f"{file}.json")

    base = [sys("base", "bm25"), sys("base", "hybrid")]
    new = [sys("new", "bm25"), sys("new", "hybrid"), sys("new", "hybrid+rerank")]
    got = [(a.label, b.label) for a, b in pairs(base + new)]
    assert got == [("base:bm25", "new:bm25"), ("base:hybrid", "new:hybrid"), ("base:bm25", "new:hybrid+rerank")]
    assert [(a.label, b.label) for a, b in pairs(base)] == [("base:bm25", "base:hybrid")]
