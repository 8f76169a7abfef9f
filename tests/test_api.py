"""The Python API: the README's example runs as written; the library prints nothing and raises retr errors."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO


def _readme_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_example(), "README.md", "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 n0 ") and "Rotate the API keys" in out[0]  # the keys note first
    assert out[2] == str(sorted(["ann", "bm25", "encode", "fusion", "total"]))
    assert (tmp_path / "notes.idx" / "manifest.json").is_file()


def test_the_library_prints_nothing_and_raises_retr_errors(tiny_dataset, tiny_bi_encoder, tmp_path, capsys):
    import retr

    index = retr.Index.build(tiny_dataset, tmp_path / "idx", model=str(tiny_bi_encoder), backend="onnx")
    results = index.search_batch(["solar panels", "wolves"], k=3, mode="dense")
    assert [len(r.hits) for r in results] == [3, 3] and results[0].pipeline == "dense"
    assert results[0].hits[0] == index.search("solar panels", k=3, mode="dense").hits[0]  # batch = one at a time
    assert capsys.readouterr().out == ""
    with pytest.raises(retr.RetrError, match="query is empty"):
        index.search("  ")
    with pytest.raises(retr.RetrError, match="mode must be one of bm25, dense, hybrid, got 'colbert'"):
        index.search("solar", mode="colbert")
    with pytest.raises(retr.RetrError, match="unknown index option"):
        retr.Index.build(tiny_dataset, tmp_path / "idx2", model=str(tiny_bi_encoder), not_an_option=1)
    index.close()
    report = retr.evaluate(tiny_dataset, pipelines=("bm25", "dense"), model=str(tiny_bi_encoder), backend="onnx",
                           k_values=(1, 10), out=tmp_path / "r.json")
    assert isinstance(report, retr.EvalReport) and set(report.pipelines) == {"bm25", "dense"}
    assert retr.EvalReport.read(tmp_path / "r.json") == report
    assert capsys.readouterr().out == ""
