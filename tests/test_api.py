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
    with pytest.raises(retr.RetrError, match="mode: pipeline 'colbert', position 1: unknown stage 'colbert'"):
        index.search("solar", mode="colbert")
    with pytest.raises(retr.RetrError, match="unknown index option"):
        retr.Index.build(tiny_dataset, tmp_path / "idx2", model=str(tiny_bi_encoder), not_an_option=1)
    index.close()
    report = retr.evaluate(tiny_dataset, modes=("bm25", "dense"), model=str(tiny_bi_encoder), backend="onnx",
                           k_values=(1, 10), out=tmp_path / "r.json")
    assert isinstance(report, retr.EvalReport) and set(report.pipelines) == {"bm25", "dense"}
    assert retr.EvalReport.read(tmp_path / "r.json") == report
    # the older names (the CLI's deprecated ones) still work, with a warning; both at once are refused
    for old in ("pipelines", "mode"):
        with pytest.warns(FutureWarning, match=f"{old}= is the older name of modes="):
            older = retr.evaluate(tiny_dataset, **{old: ("bm25",)}, k_values=(1, 10))
        assert older.pipelines["bm25"].metrics == report.pipelines["bm25"].metrics
    with pytest.raises(retr.RetrError, match="reranker is the older name of rerank: give one of them"):
        retr.evaluate(tiny_dataset, rerank="a", reranker="b")
    with pytest.raises(retr.RetrError, match="pipelines is the older name of modes"):  # the new one at its default
        retr.evaluate(tiny_dataset, ("bm25", "dense", "hybrid"), pipelines=["bm25"])
    with pytest.raises(retr.RetrError, match="aggregate is the older name of passage_aggregate"):
        retr.Index.from_documents(["a b c"], passages="32:16", passage_aggregate="maxp", aggregate="sum")
    with pytest.raises(retr.RetrError, match="passage_aggregate must be one of"):
        retr.Index.build(tiny_dataset, tmp_path / "idx3", passages="64", passage_aggregate="median")
    assert capsys.readouterr().out == ""


def test_import_retr_loads_no_search_stack_and_the_api_shows_its_configs_defaults():
    """`import retr` (which every `retr` command runs first) loads neither numpy nor a config module; the defaults
    its signatures show, kept in the light retr.retrieval.defaults, are the ones the configs own."""
    import inspect
    import os
    import subprocess
    import sys

    import retr
    from retr.eval.runner import EvalConfig
    from retr.indexes.build import IndexConfig
    from retr.indexes.dense import DenseIndexConfig
    from retr.indexes.executors import ExecutorConfig
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.passages import PassageConfig
    from retr.retrieval.pipeline import PipelineConfig
    from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE
    from retr.retrieval.rerank import DEFAULT_RERANK_DEPTH

    code = ("import sys, retr\n"
            "print(sorted(m for m in sys.modules if m in ('numpy', 'torch', 'faiss') or m.startswith(('retr.indexes', "
            "'retr.eval', 'retr.retrieval.encoder', 'retr.retrieval.pipeline', 'retr.retrieval.request'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"

    owned = {"backend": EncoderConfig.backend, "kind": DenseIndexConfig.kind, "use_cache": IndexConfig.use_cache,
             "passage_aggregate": PassageConfig.aggregate, "shards": IndexConfig.shards,
             "executor": ExecutorConfig.name, "ray_actors": ExecutorConfig.actors, "fusion": PipelineConfig.fusion,
             "fusion_depth": PipelineConfig.fusion_depth, "rerank_depth": DEFAULT_RERANK_DEPTH, "k": DEFAULT_K,
             "mode": DEFAULT_MODE, "k_values": EvalConfig.k_values, "warmup": EvalConfig.warmup}
    evaluate_owned = {**owned, "modes": tuple(p.name for p in EvalConfig.pipelines)}  # `retr eval --modes`
    checked = set()
    for fn in (retr.Index.build, retr.Index.from_documents, retr.Index.load, retr.Index.search,
               retr.Index.search_batch, retr.Index.search_topics, retr.evaluate):
        of = evaluate_owned if fn is retr.evaluate else owned
        for name, p in inspect.signature(fn).parameters.items():
            if name in of and p.default is not None:  # None: a search's own fusion, else the index's
                assert p.default == of[name], f"{fn.__qualname__}: {name}={p.default!r}, its config's {of[name]!r}"
                checked.add(name)
    assert checked == set(owned) | {"modes"}
    assert {name: getattr(retr, name) for name in retr.__all__}  # every exported name resolves
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        retr.nope  # noqa: B018
