"""`retr eval --index IDX --topics FILE --qrels FILE`: the report of `--dataset` for an index as it is (plain,
sharded, of passages, lean, changed by add/delete), and never a rebuild: no document is encoded."""

from __future__ import annotations

import json
import logging

import pytest

from retr.cli.main import main
from retr.eval.report import EvalReport

from .conftest import DOCS

MODES = "bm25,dense,hybrid"


def _refuse_encoding(monkeypatch):
    """From here on, any encoding of documents or index build fails the test."""
    import retr.indexes.build as build
    from retr.retrieval.encoder import BiEncoder

    def refuse(*args, **kwargs):
        raise AssertionError("documents were encoded or an index was built")

    for name in ("encode_corpus", "encode_like"):
        monkeypatch.setattr(BiEncoder, name, refuse)
    monkeypatch.setattr(build, "build_index", refuse)


def _eval_index(folder, dataset, out, *extra):
    assert main(["eval", "--index", str(folder), "--topics", str(dataset / "queries.jsonl"),
                 "--qrels", str(dataset / "qrels" / "test.tsv"), "--mode", MODES, "--warmup", "0",
                 "--out", str(out), *extra]) == 0
    return EvalReport.read(out)


@pytest.mark.parametrize("build_options", [[], ["--shards", "2"], ["--passages", "8:4"], ["--kind", "lean"]],
                         ids=["plain", "sharded", "passages", "lean"])
def test_eval_index_gives_the_report_of_eval_dataset(tiny_dataset, tiny_bi_encoder, tmp_path, monkeypatch,
                                                      caplog, build_options):
    expected_path = tmp_path / "dataset.json"
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", MODES, "--model", str(tiny_bi_encoder),
                 "--warmup", "0", "--out", str(expected_path), *build_options]) == 0
    folder = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(folder), "--model", str(tiny_bi_encoder),
                 *build_options]) == 0
    _refuse_encoding(monkeypatch)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="retr")
    got = _eval_index(folder, tiny_dataset, tmp_path / "index.json")
    assert "encoding" not in caplog.text and "index written" not in caplog.text
    expected = EvalReport.read(expected_path)
    assert list(got.pipelines) == list(expected.pipelines)
    for name, p in got.pipelines.items():
        assert p.metrics == expected.pipelines[name].metrics, name  # to the last digit
        assert p.per_query == expected.pipelines[name].per_query
        assert p.latency_ms["total"].n == 6 and set(p.latency_ms) == set(expected.pipelines[name].latency_ms)
    assert got.index["folder"] == str(folder) and got.dataset.num_docs == len(DOCS)
    assert got.index["manifest"]["corpus"]["sha256"] == expected.index["manifest"]["corpus"]["sha256"]
    assert got.pipelines["bm25"].run_file and (tmp_path / "index-runs").is_dir()


@pytest.fixture()
def changed_index(tiny_dataset, tiny_bi_encoder, tmp_path):
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in DOCS[:12]))
    folder = tmp_path / "idx"
    assert main(["index", "--corpus", str(base), "--out", str(folder), "--model", str(tiny_bi_encoder)]) == 0
    added = tmp_path / "added.jsonl"
    added.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in DOCS[12:]))
    assert main(["add", str(folder), "--corpus", str(added)]) == 0
    gone = tmp_path / "gone.txt"
    gone.write_text("d12\n")
    assert main(["delete", str(folder), "--ids", str(gone)]) == 0
    return folder


def test_eval_index_after_add_and_delete(changed_index, tiny_dataset, tmp_path, monkeypatch, caplog):
    _refuse_encoding(monkeypatch)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="retr")
    report = _eval_index(changed_index, tiny_dataset, tmp_path / "changed.json")
    assert "encoding" not in caplog.text
    assert report.dataset.num_docs == len(DOCS) - 1
    assert [c["op"] for c in report.index["manifest"]["changes"]] == ["add", "delete"]
    # q5's one relevant document (d12) was deleted: its judgement is dropped, counted, and q5 is not scored
    assert report.dataset.qrels_check["unknown_docs"] == 1
    bm25 = report.pipelines["bm25"]
    assert "q5" not in bm25.per_query and bm25.num_queries_scored == 5
    assert bm25.per_query["q1"]["Recall@10"] == 1.0  # d13, added after the build, is found


def test_eval_index_input_errors(tiny_dataset, tmp_path, capsys):
    cases = [
        (["eval", "--index", str(tmp_path)], "--index needs --topics FILE"),
        (["eval", "--dataset", str(tiny_dataset), "--topics", "x.tsv"], "--topics goes with --index"),
        (["eval", "--index", str(tmp_path / "none"), "--topics", str(tiny_dataset / "queries.jsonl"),
          "--qrels", str(tiny_dataset / "qrels" / "test.tsv")], "none"),
    ]
    for argv, message in cases:
        assert main(argv) != 0, argv
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and not x.startswith("[retr]")]
        assert len(err) == 1 and message in err[0], (argv, err)
