"""The CLI, in-process: end to end on ADI with the bundled model, a user's own corpus, bad input."""

from __future__ import annotations

import json
import logging

import pytest

from retr.cli.main import main

from .conftest import SHARED

ADI = SHARED / "adi"


def _error_lines(stderr: str) -> list[str]:
    """Lines that are not log records: what the user is told went wrong."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[retr]")]


@pytest.mark.skipif(not ADI.is_dir(), reason="../shared/datasets/adi not present")
def test_eval_end_to_end_on_adi_matches_beir_and_reuses_cache(tmp_path, capsys, caplog):
    from beir.retrieval.evaluation import EvaluateRetrieval

    from retr.eval.data import load_dataset
    from retr.eval.report import EvalReport
    from retr.eval.trec import read_trec

    report_path, runs = tmp_path / "report.json", tmp_path / "runs"
    argv = ["eval", "--dataset", str(ADI), "--pipelines", "bm25,dense,hybrid", "--out", str(report_path),
            "--run-dir", str(runs), "--k-values", "1,3,10,100"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "adi (test): 82 docs, 35 queries scored" in out
    for name in ("bm25", "dense", "hybrid"):
        assert any(line.startswith(name) for line in out.splitlines())
    report = EvalReport.read(report_path)
    assert EvalReport.from_json(report.to_json()) == report  # the typed report round-trips through JSON
    assert report.dataset.num_queries == 35
    ds = load_dataset(str(ADI))
    for name, p in report.pipelines.items():
        assert p.num_queries_scored == 35 and p.name == name
        total = p.latency_ms["total"]
        assert total.n == 35 and total.p50 > 0 and total.p99 >= total.p50
        assert p.qps > 0 and p.index_bytes > 0 and p.build_seconds > 0
        assert set(p.per_query) == set(ds.qrels) and set(p.per_query_latency_ms) == set(ds.queries)
        for metric, mean in p.metrics.items():  # the means are the means of the per-query values kept
            assert mean == pytest.approx(sum(q[metric] for q in p.per_query.values()) / 35, abs=1e-12)
        run = read_trec(p.run_file)
        ndcg, _map, rec, prec = EvaluateRetrieval.evaluate(ds.qrels.to_dict(), run.to_dict(), [1, 3, 10, 100],
                                                           ignore_identical_ids=False)
        for metric, value in {**ndcg, **_map, **rec, **prec}.items():
            assert round(p.metrics[metric], 5) == value, (name, metric)
    assert set(report.pipelines["hybrid"].latency_ms) == {"encode", "ann", "bm25", "fusion", "total"}
    # the bundled model is a real retriever: far better than chance on ADI
    assert report.pipelines["dense"].metrics["NDCG@10"] > 0.4
    assert report.pipelines["hybrid"].metrics["NDCG@10"] > 0.4
    assert report.environment["versions"]["faiss-cpu"].count(".") >= 1
    # second run: everything from the cache, nothing encoded
    caplog.clear()
    caplog.set_level(logging.INFO, logger="retr")
    assert main(argv) == 0
    assert "index cache used" in caplog.text and "encoding" not in caplog.text
    again = EvalReport.read(report_path)
    for name in report.pipelines:
        assert again.pipelines[name].metrics == report.pipelines[name].metrics


def test_index_and_search_a_users_jsonl_with_paths_only(tmp_path, capsys):
    corpus = tmp_path / "notes.jsonl"
    rows = [{"_id": "a", "title": "Espresso", "text": "Espresso is coffee brewed by forcing hot water through beans."},
            {"_id": "b", "title": "Glaciers", "text": "Glaciers are rivers of ice that carve valleys."},
            {"_id": "c", "title": "", "text": "Bicycles have two wheels and pedals."}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus), "--out", str(idx)]) == 0
    assert "indexed 3 documents" in capsys.readouterr().out and (idx / "bm25").is_dir()  # BM25 by default
    assert main(["search", str(idx), "how is coffee made", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["1", "a"] and "Espresso" in out
    assert main(["search", str(idx), "ice in the mountains", "--json", "-k", "3"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in res["results"]] == [1, 2, 3] and res["results"][0]["id"] == "b"
    assert set(res["latency_ms"]) == {"encode", "ann", "bm25", "fusion"}  # hybrid: the default mode everywhere
    assert main(["search", str(idx), "coffee", "--mode", "bm25", "-k", "1"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["1", "a"]
    # a dense-only index asked for bm25: a clear error, not a traceback
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "dense-only"), "--no-bm25"]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "dense-only"), "coffee", "--mode", "bm25"]) == 2
    assert "without --no-bm25" in capsys.readouterr().err


def test_search_modes_and_rerank_with_tiny_models(tiny_dataset, tiny_bi_encoder, tiny_cross_encoder, tmp_path,
                                                  capsys):
    idx = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--bm25", "--model",
                 str(tiny_bi_encoder), "--kind", "hnsw"]) == 0
    capsys.readouterr()
    assert main(["search", str(idx), "solar panels", "--mode", "bm25", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["results"][0]["id"] == "d1"
    assert main(["search", str(idx), "solar panels", "--mode", "hybrid", "--fusion", "minmax",
                 "--rerank", str(tiny_cross_encoder), "--rerank-depth", "5", "--json", "-k", "3"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["pipeline"] == "hybrid+rerank" and len(res["results"]) == 3
    assert set(res["latency_ms"]) == {"encode", "ann", "bm25", "fusion", "rerank"}
    # a reranker folder that is not a cross-encoder
    assert main(["search", str(idx), "x", "--rerank", str(tiny_bi_encoder)]) == 2
    assert "not a cross-encoder" in capsys.readouterr().err
    # an index built with another model than the query encoder
    assert main(["search", str(idx), "x", "--model", "default"]) == 2
    err = _error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "built with model" in err[0] and "search without --model" in err[0]


def test_eval_with_rerank_pipeline_on_tiny_dataset(tiny_dataset, tiny_bi_encoder, tiny_cross_encoder, tmp_path,
                                                   capsys):
    report = tmp_path / "r.json"
    assert main(["eval", "--dataset", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--modes",
                 "hybrid,hybrid+rerank", "--rerank", str(tiny_cross_encoder), "--rerank-depth", "4",
                 "--rerank-backend", "onnx", "--k-values", "1,5,10", "--warmup", "1", "--out", str(report)]) == 0
    rep = json.loads(report.read_text())
    assert rep["pipelines"]["hybrid+rerank"]["latency_ms"]["rerank"]["n"] == 6
    assert rep["reranker"]["depth"] == 4
    assert rep["reranker"]["backend"] == "onnx" and rep["reranker"]["precision"] == "fp32"
    assert rep["reranker"]["trained_on_this_corpus"] is None  # a folder retr did not train: unknown
    assert "NDCG@10" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["index", "--corpus", "nope.jsonl", "--out", "x"], "nope.jsonl: no such file"),
    (["eval", "--dataset", "./missing-folder"], "no such dataset folder"),
    (["eval", "--dataset", "absent-name", "--no-download"], "put its BEIR folder"),
    (["search", "no-index-here", "q"], "no such index folder"),
])
def test_bad_input_is_one_line_and_nonzero(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _error_lines(capsys.readouterr().err)
    assert len(err) == 1 and needle in err[0]
    assert not (tmp_path / "x").exists()


def test_malformed_corpus_leaves_nothing_behind(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1", "text": "fine"}\n{"_id": "2", "text": \n')
    assert main(["index", "--corpus", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert f"{bad}:2: malformed JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_pipeline_and_bad_k(capsys):
    assert main(["eval", "--dataset", "x", "--pipelines", "dense,colbert"]) == 2
    assert "position 7: unknown stage 'colbert'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["eval", "--dataset", "x", "--k-values", "0,5"])
    assert e.value.code == 2


def test_cli_choices_and_defaults_come_from_the_configs():
    from retr.cli.main import build_parser
    from retr.indexes.dense import KINDS, DenseIndexConfig
    from retr.retrieval.backends.registry import BACKENDS, SCORING, choices

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    index_opts = {a.dest: a for a in sub["index"]._actions}
    assert tuple(index_opts["backend"].choices) == tuple(BACKENDS) and index_opts["backend"].default == "openvino-int8"
    assert tuple(index_opts["kind"].choices) == KINDS
    assert index_opts["ef_search"].default == DenseIndexConfig().ef_search
    search_opts = {a.dest: a for a in sub["search"]._actions}
    assert tuple(search_opts["rerank_backend"].choices) == choices(SCORING)
    assert "openvino-int8" in choices(SCORING) and "torch" in choices(SCORING)


def test_eval_on_the_shipped_fixture_matches_beir_reuses_and_rebuilds_its_cache(tiny_dataset, tiny_bi_encoder,
                                                                                   tmp_path, capsys, caplog):
    """The TREC run-file round trip against BEIR and the index cache, on data the repo itself makes (no
    ../shared needed): a damaged cached index is rebuilt, and the numbers do not move."""
    from beir.retrieval.evaluation import EvaluateRetrieval

    from retr.eval.data import load_dataset
    from retr.eval.report import EvalReport
    from retr.eval.trec import read_trec

    report_path = tmp_path / "r.json"
    argv = ["eval", "--dataset", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--backend", "onnx",
            "--pipelines", "bm25,dense,hybrid", "--k-values", "1,3,10", "--out", str(report_path)]
    assert main(argv) == 0  # --pipelines: the deprecated name of --mode still runs the pipelines it names
    report = EvalReport.read(report_path)
    assert list(report.pipelines) == ["bm25", "dense", "hybrid"]
    ds = load_dataset(str(tiny_dataset))
    for name, p in report.pipelines.items():
        run = read_trec(p.run_file)
        ndcg, _map, rec, prec = EvaluateRetrieval.evaluate(ds.qrels.to_dict(), run.to_dict(), [1, 3, 10],
                                                           ignore_identical_ids=False)
        # a query BM25 finds nothing for (q6: unknown words) is scored 0 by retr, as pytrec_eval scores a query
        # that was run; a TREC file cannot hold it, so BEIR averages over the others: same sums, other counts
        scored = len(run)
        assert scored == (5 if name == "bm25" else 6)
        for metric, value in {**ndcg, **_map, **rec, **prec}.items():
            if scored == 6:
                assert round(p.metrics[metric], 5) == value, (name, metric)
            else:
                assert p.metrics[metric] * 6 == pytest.approx(value * 5, abs=6e-5), (name, metric)
    folder = report.index["folder"]
    caplog.set_level(logging.INFO, logger="retr")
    assert main(argv) == 0
    assert "index cache used" in caplog.text
    (tmp_path / "retr-cache" / "indexes").joinpath(folder.rsplit("/", 1)[-1], "dense.faiss").write_bytes(b"junk")
    caplog.clear()
    assert main(argv) == 0
    assert "unusable" in caplog.text and "rebuilding" in caplog.text and "index cache used" not in caplog.text
    again = EvalReport.read(report_path)
    assert {n: p.metrics for n, p in again.pipelines.items()} == {n: p.metrics for n, p in report.pipelines.items()}


def test_eval_config_alone_is_valid_and_runs_without_the_cli(tiny_dataset, tiny_bi_encoder):
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.errors import RetrError
    from retr.retrieval.pipeline import parse_pipelines

    cfg = EvalConfig()
    assert [p.name for p in cfg.pipelines] == ["bm25", "dense", "hybrid"] and cfg.reranker is None
    with pytest.raises(RetrError, match="rerank pipelines need a cross-encoder"):
        EvalConfig(pipelines=parse_pipelines("dense+rerank"))
    report = run_eval(load_dataset(str(tiny_dataset)),
                      EvalConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder), backend="onnx"), k_values=(1, 10)))
    assert set(report.pipelines) == {"bm25", "dense", "hybrid"}
    assert report.pipelines["dense"].num_queries_scored == 6 and report.pipelines["dense"].run_file is None


def test_sigterm_stops_retr_index_and_removes_its_building_folder_as_ctrl_c_does(tiny_bi_encoder, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    words = "solar wind grid battery storage turbine panel voltage current heat pump roof cell charge".split()
    corpus = tmp_path / "c.jsonl"
    with corpus.open("w") as fh:  # enough documents that the build is still running when it is stopped
        for i in range(20_000):
            fh.write(json.dumps({"id": f"d{i}", "text": " ".join(words[(i * 7 + j) % len(words)] for j in range(40))})
                     + "\n")
    out = tmp_path / "x.idx"
    proc = subprocess.Popen([sys.executable, "-m", "retr.cli.main", "index", "--corpus", str(corpus), "--out",
                             str(out), "--model", str(tiny_bi_encoder)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RETR_PROGRESS_SECONDS": "0"})
    deadline = time.time() + 240
    while not list(tmp_path.glob(".x.idx.*.building")):  # the build has begun
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "the build ended before it could be stopped: give it more documents"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "retr: terminated" in err, (proc.returncode, err[-2000:])
    assert not list(tmp_path.glob(".x.idx.*")) and not out.exists()
