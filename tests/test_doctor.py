"""`retr doctor`, in-process on the tiny BERT: the CPU, the candidates timed, the choice and the first-run cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retr.cli.main import main
from retr.retrieval.query_graphs import ONE_STREAM

ONE = "openvino" + ONE_STREAM


def test_doctor_prints_the_cpu_the_candidates_the_choice_and_the_first_run_cost(tiny_bi_encoder, capsys,
                                                                                   monkeypatch):
    from retr.retrieval.backends.platform import this_platform

    monkeypatch.setenv("RETR_INT8_DOT", "0")  # a CPU without int8 dot products: static int8 pruned
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["platform"]["cpu"] == this_platform().cpu and report["model_hash"]
    queries = report["queries"]
    # the documents' graph, and where it runs several streams the same graph as one stream (nothing else cached)
    names = [c["backend"] for c in queries["candidates"]]
    assert names[0] == "openvino" and set(names) <= {"openvino", ONE} and queries["chosen"] in names
    assert queries["candidates"][0]["ms_per_query"] > 0 and queries["candidates"][0]["made_seconds"] > 0
    assert report["documents"]["chosen"] == "openvino" and "pruned" in report["documents"]["why"]
    assert {p["backend"] for p in report["pruned"]} == {"openvino-int8", "openvino-int8-ffn", "openvino-int8w"}
    assert set(report["not_in_cache"]) == {"onnx", "onnx-int8"}
    first = report["first_run"]
    assert first["docs"] == 500 and first["graph_build_seconds"] > 0
    assert abs(first["encode_seconds_estimate"] - 500 * report["documents"]["base"]["ms_per_doc"] / 1000) < 1e-9
    # the graph plan it stored, which `retr index` reads: the base graph at any size on this CPU
    plan = report["plan"]
    assert json.loads(Path(plan["path"]).read_text()) == {k: v for k, v in plan.items() if k != "path"}
    assert plan["large_graph"] == "base" and plan["small"] == plan["large"] and plan["large"].startswith("openvino/")

    monkeypatch.setenv("RETR_INT8_DOT", "1")  # with them: int8 a candidate, its break-even said (assumed: not made)
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--verbose"]) == 0
    text = capsys.readouterr().out
    assert "CPU: " in text and "queries (one alone, ms):" in text and "chosen: openvino" in text
    assert "openvino-int8" in text and "assumed" in text
    assert ("int8 pays from ~" in text or "int8 is no faster here" in text) and "None" not in text
    assert "first run on 500 new documents here" in text
    # the summary first, the detail after it
    assert text.index("graphs: documents through ") < text.index("suggestion: ") < text.index("detail:") \
        < text.index("queries (one alone, ms):")
    here = this_platform()
    if here.precision_probe is not None:  # bf16 native here: the probe measured it, and doctor says what it chose
        assert f"bf16 or fp32 (measured once here): bf16 {here.precision_probe.bf16_ms:.1f} ms" in text
        assert f"graphs compute in {here.precision};" in text
    elif not here.bf16_native:
        assert "bf16: no native instructions here: fp32" in text


def test_doctor_leads_with_a_plain_summary_and_keeps_the_detail_for_verbose(tiny_bi_encoder, capsys, monkeypatch):
    import re

    monkeypatch.setenv("RETR_INT8_DOT", "0")  # an AVX2-only class of CPU, as far as int8 goes
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    summary = report["summary"]
    assert summary["documents_graph"] == report["documents"]["chosen"] == "openvino"
    assert summary["queries_graph"] == report["queries"]["chosen"]
    runs = {x["docs"]: x["seconds"] for x in summary["first_runs"]}
    per_doc = report["documents"]["base"]["ms_per_doc"] / 1000
    build = report["first_run"]["graph_build_seconds"]
    assert set(runs) == {1000, 100_000}
    assert runs[1000] == pytest.approx(build + 1000 * per_doc) and runs[100_000] == pytest.approx(build + 1e5 * per_doc)
    from retr.cli.doctor import CLASS_FIRST_RUN, SCIFACT_DOCS, SCIFACT_TOKENS

    if summary["cpu_class"] in CLASS_FIRST_RUN:  # SciFact's encoding estimated here against the class's first run
        assert summary["estimate_against_class"] == pytest.approx(
            SCIFACT_DOCS * runs[100_000] / 1e5 * SCIFACT_TOKENS / 200 / CLASS_FIRST_RUN[summary["cpu_class"]][1])
    assert summary["suggestion"] and summary["cpu_class"] in ("AVX2 only", "AVX-512 without VNNI", "AMX", "no AVX2")
    assert main(["doctor", "--model", str(tiny_bi_encoder)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("CPU: ") and summary["cpu_class"] in lines[0]
    # the query graph is timed again by this run: either candidate may win it
    assert re.fullmatch(rf"graphs: documents through openvino, queries through (openvino|{ONE}) "
                        rf"\(computing in {report['platform']['precision']}\)", lines[1]), lines[1]
    assert re.search(r"first run here .*: 1,000 documents ~[\d.]+ (s|min|h), 100,000 documents ~[\d.]+ (s|min|h)$",
                     lines[2]), lines[2]
    assert any(line.startswith("suggestion: ") for line in lines)
    assert "pruned:" not in text and "queries (one alone, ms)" not in text and "retr doctor --verbose" in text


def test_doctor_times_the_documents_graphs_as_the_index_will_and_stores_it(tiny_bi_encoder, capsys, monkeypatch):
    """With the int8 graph made, doctor's documents figures are the planner's alternating per-token timing, stored:
    a later `retr index` reads them and times nothing, so what doctor shows is what an index decides by."""
    from retr.retrieval.backends import chooser
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    monkeypatch.setenv("RETR_INT8_DOT", "1")
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--doc-tokens", "10", "--export",
                 "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)["documents"]
    assert docs["int8"]["measured"] is True
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    calibrated = enc.exported.find("openvino-int8", enc.planner.calibration)
    monkeypatch.setattr(chooser, "time_alternating", lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed")))
    speeds = enc.planner.speeds.measured_per_token(calibrated)
    assert abs(docs["base"]["ms_per_doc"] - speeds.base * 10 * 1000) < 1e-9
    assert abs(docs["int8"]["int8_s"] - speeds.int8 * 10) < 1e-12


def test_doctor_shows_the_int8_weights_graph_a_corpus_too_small_for_a_calibration_takes(tiny_bi_encoder, capsys,
                                                                                          monkeypatch):
    """Where int8 runs and nothing is calibrated yet, doctor weighs the corpus as `retr index` does: the base and
    int8-weights graphs timed (fake here: 4 and 2 ms a token); the int8-weights graph faster, static int8 assumed
    1.3x faster than it, and its calibration weighed against it."""
    from retr.retrieval.backends.cost import prior
    CALIBRATION_PRIOR_S = prior("calibration_s")
    from retr.retrieval.corpus_speeds import DocumentSpeeds

    monkeypatch.setenv("RETR_INT8_DOT", "1")  # int8 dot products: int8 assumed 1.44x the base graph
    # an fp32 base graph, over which int8 weights are assumed 1.7x (over bf16, 1.1x: never weighed for this corpus)
    monkeypatch.setenv("RETR_BF16", "0")
    speeds = {"openvino": 0.004, "openvino-int8w": 0.002}
    monkeypatch.setattr(DocumentSpeeds, "token_seconds", lambda self, graph: speeds[graph.variant])
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--doc-tokens", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    docs = report["documents"]
    assert docs["base"]["ms_per_doc"] == pytest.approx(40) and docs["weights"]["ms_per_doc"] == pytest.approx(20)
    assert docs["weights"]["backend"] == "openvino-int8w" and docs["chosen"] == "openvino-int8w"
    # static int8 assumed 1.3x the measured int8-weights graph: 2.3 s saved on 500 documents, under the
    # calibration's assumed cost (CALIBRATION_PRIOR_S)
    assert docs["int8"]["pays"] is False and docs["int8"]["int8_s"] == pytest.approx(0.020 / 1.3)
    even = CALIBRATION_PRIOR_S / (0.020 - 0.020 / 1.3)
    assert even > 500 and f"int8 pays from ~{round(even)} documents" in docs["why"]
    assert report["first_run"]["encode_seconds_estimate"] == pytest.approx(10.0)
    assert "openvino-int8w" not in report["not_in_cache"]  # a documents' graph, not a query candidate
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--doc-tokens", "10", "--verbose"]) == 0
    assert "openvino-int8w 20.0 (measured)" in capsys.readouterr().out


def test_doctor_says_where_the_base_graphs_speed_is_estimated_from_the_probe_not_timed(tiny_bi_encoder, capsys,
                                                                                      monkeypatch):
    """Where the planner weighs a corpus on the base graph's estimated speed (``Break.base_estimated``), doctor shows
    that figure as estimated, in its JSON and in its text."""
    from retr.retrieval.backends.cost import Break
    from retr.retrieval.corpus_weighing import Weighing

    monkeypatch.setenv("RETR_INT8_DOT", "1")  # int8 a candidate on any CPU
    monkeypatch.setattr(Weighing, "calibration_break",
                        lambda self, docs, tokens: Break(docs, 0.04, 0.02, 4.0, False, base_estimated=True))
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "5000", "--doc-tokens", "10", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)["documents"]["base"]
    assert base["estimated"] is True and base["ms_per_doc"] == pytest.approx(40)
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "5000", "--doc-tokens", "10", "--verbose"]) == 0
    assert "40.0 (estimated from the precision probe, not timed)" in capsys.readouterr().out


def test_doctor_shows_each_query_candidates_ranking_noise_beside_its_speed(tiny_bi_encoder, capsys):
    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends.export import EMBEDDING
    from retr.retrieval.backends.graphs import load_or_export
    from retr.retrieval.backends.registry import BACKENDS
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder)))
    load_or_export(lambda: enc.model, enc.model_hash, BACKENDS["onnx"], EMBEDDING, enc.max_length, cache_home())
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--json"]) == 0
    queries = json.loads(capsys.readouterr().out)["queries"]
    rows = {c["backend"]: c for c in queries["candidates"]}
    assert set(rows) - {ONE} == {"openvino", "onnx"} and queries["max_rank_noise"] == 0.05
    assert rows["openvino"]["rank_noise"] is None  # the documents' own graph: nothing to compare
    assert 0 <= rows["onnx"]["rank_noise"] < 0.05 and rows["onnx"]["passed"] and rows["onnx"]["ms_per_query"] > 0
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--verbose"]) == 0
    assert "ranking noise " in capsys.readouterr().out


def test_doctor_times_a_cross_encoders_graphs_at_the_rerank_depth(tiny_bi_encoder, tiny_cross_encoder, capsys,
                                                                    monkeypatch):
    """`--rerank MODEL`: the configured graph timed on one query's pairs; `--export` makes every other graph this
    machine can run first, and all are timed, checked for ranking noise and one chosen (and stored)."""
    monkeypatch.setenv("RETR_INT8_DOT", "0")  # static int8 pruned: no calibration in this test
    args = ["doctor", "--model", str(tiny_bi_encoder), "--rerank", str(tiny_cross_encoder), "--rerank-depth", "5"]
    assert main([*args, "--json"]) == 0
    ce = json.loads(capsys.readouterr().out)["rerank"]
    assert ce["depth"] == 5 and [c["backend"] for c in ce["candidates"]] == ["openvino"]
    assert ce["chosen"] == "openvino" and "onnx" in ce["not_in_cache"] and ce["candidates"][0]["ms_per_query"] > 0
    assert main([*args, "--export", "--json"]) == 0
    ce = json.loads(capsys.readouterr().out)["rerank"]
    timed = {c["backend"]: c for c in ce["candidates"]}
    refused = {r["backend"] for r in ce["refused"]}
    assert {"openvino", "onnx"} <= set(timed) and not ce["not_in_cache"]
    assert set(timed) | refused == {"openvino", "onnx", "onnx-int8"}
    assert {p["backend"] for p in ce["pruned"]} == {"openvino-int8", "openvino-int8-ffn"}
    assert timed["onnx"]["rank_noise"] is not None and timed["onnx"]["made_seconds"] > 0
    assert ce["chosen"] in [b for b, c in timed.items() if c["passed"]]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "cross-encoder: " in text and "one query's 5 pairs" in text and "chosen: " in text
