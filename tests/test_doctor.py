"""`retr doctor`, in-process on the tiny BERT: the CPU, the candidates timed, the choice and the first-run cost."""

from __future__ import annotations

import json

from retr.cli.main import main


def test_doctor_prints_the_cpu_the_candidates_the_choice_and_the_first_run_cost(tiny_bi_encoder, capsys,
                                                                                   monkeypatch):
    from retr.retrieval.backends.platform import this_platform

    monkeypatch.setenv("RETR_INT8_DOT", "0")  # a CPU without int8 dot products: static int8 pruned
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["platform"]["cpu"] == this_platform().cpu and report["model_hash"]
    queries = report["queries"]
    assert queries["chosen"] == "openvino" and [c["backend"] for c in queries["candidates"]] == ["openvino"]
    assert queries["candidates"][0]["ms_per_query"] > 0 and queries["candidates"][0]["made_seconds"] > 0
    assert report["documents"]["chosen"] == "openvino" and "pruned" in report["documents"]["why"]
    assert {p["backend"] for p in report["pruned"]} == {"openvino-int8", "openvino-int8-ffn"}
    assert set(report["not_in_cache"]) == {"onnx", "onnx-int8"}
    first = report["first_run"]
    assert first["docs"] == 500 and first["graph_build_seconds"] > 0
    assert abs(first["encode_seconds_estimate"] - 500 * report["documents"]["base"]["ms_per_doc"] / 1000) < 1e-9

    monkeypatch.setenv("RETR_INT8_DOT", "1")  # with them: int8 a candidate, its break-even said (assumed: not made)
    assert main(["doctor", "--model", str(tiny_bi_encoder), "--docs", "500"]) == 0
    text = capsys.readouterr().out
    assert "CPU: " in text and "queries (one alone, ms):" in text and "chosen: openvino" in text
    assert "openvino-int8" in text and "assumed" in text and "break-even" in text
    assert "first run on 500 new documents here" in text
