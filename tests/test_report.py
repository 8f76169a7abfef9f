"""`retr report`: a self-contained HTML page from eval reports (rendered in a browser by tests/test_browser.py)."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.eval.visual import pareto


def test_pareto_front_by_hand():
    # (latency, quality): b is beaten by a (faster and better); d by c; e ties a on latency and is worse
    points = [(1.0, 0.6), (2.0, 0.5), (5.0, 0.7), (6.0, 0.65), (1.0, 0.4), (9.0, 0.8)]
    assert pareto(points) == [0, 2, 5]
    assert pareto([(1.0, 0.5), (1.0, 0.5)]) == [0, 1]  # equal points: neither beats the other


@pytest.fixture(scope="module")
def reports(tiny_dataset, tiny_bi_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    out = []
    for name, pipelines in (("a", "bm25,dense"), ("b", "hybrid")):
        path = root / f"{name}.json"
        assert main(["eval", "--dataset", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--backend", "onnx",
                     "--pipelines", pipelines, "--k-values", "1,3,10", "--warmup", "1", "--out", str(path)]) == 0
        out.append(path)
    return out


def test_report_page_holds_the_table_and_every_figure(reports, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["report", *map(str, reports), "--out", str(page), "--pair", "a:bm25", "b:hybrid"]) == 0
    assert "3 figures embedded" in capsys.readouterr().out  # quality/latency, Recall@k, the one dataset's deltas
    text = page.read_text()
    assert text.count("<tr>") == 1 + 3  # header + three pipelines
    assert "a:bm25" in text and "b:hybrid" in text and 'id=pareto' in text and 'id=recall' in text
    assert "src=\"http" not in text and "<script src" not in text  # self-contained


def test_report_draws_the_default_pipeline_against_each_other_one_by_default(reports, tmp_path, capsys):
    import re

    page = tmp_path / "report.html"
    assert main(["report", *map(str, reports), "--out", str(page)]) == 0
    assert "4 figures embedded" in capsys.readouterr().out  # quality/latency, Recall@k, hybrid against bm25, dense
    heads = re.findall(r"<h3>[^<]*: ([^<]*) against ([^<]*)</h3>", page.read_text())
    assert heads == [("b:hybrid", "a:bm25"), ("b:hybrid", "a:dense")], heads


def test_report_refuses_an_unknown_pair_and_a_non_report(reports, tmp_path, capsys):
    assert main(["report", *map(str, reports), "--out", str(tmp_path / "r.html"), "--pair", "a:bm25", "nope"]) == 2
    assert "--pair a:bm25 nope" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a retr eval report" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_a_report_of_runs_made_elsewhere_renders_without_latency(tiny_dataset, tmp_path, capsys):
    """`retr eval --run` then `retr report` (the documented workflow) was a matplotlib traceback: a run made
    elsewhere has no latency to draw on a log axis."""
    from retr.eval.data import load_qrels
    from retr.eval.trec import write_run
    from retr.retrieval.types import Run

    qrels_path = tiny_dataset / "qrels" / "test.tsv"
    qrels = load_qrels(qrels_path)
    runs = []
    for name, docs in (("base", lambda q: list(qrels[q])), ("other", lambda q: list(qrels[q])[::-1])):
        runs.append(tmp_path / f"{name}.trec")
        write_run(Run({q: [(d, 1.0 / (i + 1)) for i, d in enumerate(docs(q))] for q in qrels}), runs[-1])
    report = tmp_path / "runs.json"
    assert main(["eval", *(a for r in runs for a in ("--run", str(r))), "--qrels", str(qrels_path),
                 "--out", str(report)]) == 0
    page = tmp_path / "runs.html"
    assert main(["report", str(report), "--out", str(page)]) == 0
    text = page.read_text()
    assert "No latency was measured" in text and "id=pareto" not in text and 'id=recall' in text
    assert "<td>-</td>" in text and "nan" not in text
