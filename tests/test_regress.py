"""Expected scores as data: `retr regress` measures them again and fails on drift; the docs' table of figures
(docs/reference/expected-scores.md) is generated from the file; the cheap entries (ADI, CISI with the bundled
model) hold in every CI run."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.eval.regress import load_expected, markdown_table

from .conftest import REPO, SHARED

SCORES = REPO / "benchmarks" / "expected" / "scores.toml"


def _toml(entries) -> str:
    out = []
    for e in entries:
        out.append("[[expect]]\n" + "".join(f"{k} = {json.dumps(v) if not isinstance(v, dict) else v_toml(v)}\n"
                                            for k, v in e.items()))
    return "\n".join(out)


def v_toml(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


def _measured_entries(dataset, tmp_path, pipelines: tuple[str, ...], opts: dict, *eval_args: str) -> list[dict]:
    """Expected entries holding what `retr eval` measures now (NDCG@10 of each pipeline, tolerance 1e-9)."""
    report = tmp_path / "r.json"
    assert main(["eval", "--dataset", str(dataset), "--pipelines", ",".join(pipelines), *eval_args,
                 "--k-values", "10", "--warmup", "1", "--out", str(report)]) == 0
    measured = json.loads(report.read_text())["pipelines"]
    return [{"dataset": str(dataset), "pipeline": p, "metric": "NDCG@10", "value": measured[p]["metrics"]["NDCG@10"],
             "tolerance": 1e-9, "options": opts} for p in pipelines]


def test_regress_passes_on_measured_scores_and_fails_on_drift(tiny_dataset, tiny_bi_encoder, tmp_path, capsys):
    entries = _measured_entries(tiny_dataset, tmp_path, ("bm25", "hybrid"),
                                {"model": str(tiny_bi_encoder), "backend": "onnx"},
                                "--model", str(tiny_bi_encoder), "--backend", "onnx")
    good = tmp_path / "good.toml"
    good.write_text(_toml(entries))
    capsys.readouterr()
    assert main(["regress", str(good)]) == 0
    assert "2 of 2 expected scores hold" in capsys.readouterr().out
    entries[1]["value"] += 0.01
    bad = tmp_path / "bad.toml"
    bad.write_text(_toml(entries))
    assert main(["regress", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "DRIFT" in out and "1 drifted" in out


@pytest.mark.parametrize("text,message", [
    ("", "no [[expect]] entries"),
    ('[[expect]]\ndataset = "adi"\n', "missing pipeline"),
    ('[[expect]]\ndataset="a"\npipeline="bm25"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\nopts={}\n', "unknown key"),
    ('[[expect]]\ndataset="a"\npipeline="bm25"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\noptions={gpu=1}\n',
     "unknown option 'gpu'"),
    ("[[expect]\n", "not valid TOML"),
    ('[[expect]]\ndataset="a"\npipeline="dense"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\nexport="3"\n',
     "export must be a graph export generation"),
    ('[[expect]]\ndataset="a"\npipeline="bm25+x"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\n', "unknown stage 'x'"),
])
def test_bad_expected_files_are_refused(tmp_path, capsys, text, message):
    path = tmp_path / "e.toml"
    path.write_text(text)
    assert main(["regress", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err


def test_expected_scores_of_another_kind_of_cpu_are_skipped_and_said_so(tmp_path, capsys, monkeypatch):
    from retr.eval.regress import for_this_cpu
    from retr.retrieval.backends.platform import this_platform

    entries = load_expected(SCORES)
    kinds = {e.cpu for e in entries}
    assert None in kinds and {"bf16+int8", "fp32"} <= kinds  # BM25 on any CPU; dense and hybrid per kind
    for kind in ("bf16+int8", "fp32"):
        kept, other = for_this_cpu(entries, kind)
        assert other == sum(e.cpu not in (None, kind) for e in entries) > 0
        assert all(e.cpu in (None, kind) for e in kept) and any(e.cpu == kind for e in kept)
    monkeypatch.setenv("RETR_INT8_DOT", "1")
    assert this_platform().kind.endswith("+int8")
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\ndataset="adi"\npipeline="dense"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\n'
                    'cpu="no-such-cpu"\n')
    assert main(["regress", str(path)]) == 0  # nothing of this CPU's kind: nothing measured, and said
    out = capsys.readouterr().out
    assert "1 expected score(s) measured on another kind of CPU skipped" in out and "nothing measured" in out


def test_expected_scores_of_graphs_exported_another_way_are_skipped_and_said_so(tmp_path, capsys):
    """A figure measured with graphs of another export generation is not checked against today's graphs (their
    rounding differs): skipped, and the runner says how many and why; one of today's generation is measured."""
    from retr.eval.regress import for_this_export
    from retr.retrieval.backends.graphs import EXPORT_GENERATION
    from retr.retrieval.backends.platform import this_platform

    entries = load_expected(SCORES)
    assert {e.export for e in entries if e.cpu is None} == {None}  # BM25: no graph
    assert all(e.export is not None for e in entries if e.cpu is not None)  # dense and hybrid name their graphs
    assert any(e.export == EXPORT_GENERATION for e in entries)
    kept, older = for_this_export(entries, EXPORT_GENERATION)
    assert older == sum(e.export not in (None, EXPORT_GENERATION) for e in entries)
    assert all(e.export in (None, EXPORT_GENERATION) for e in kept)
    path = tmp_path / "e.toml"
    path.write_text(f'[[expect]]\ndataset="adi"\npipeline="dense"\nmetric="NDCG@10"\nvalue=0.5\ntolerance=0.1\n'
                    f'cpu="{this_platform().kind}"\nexport={EXPORT_GENERATION - 1}\n')
    assert main(["regress", str(path)]) == 0  # nothing left to measure: nothing measured, and said why
    out = capsys.readouterr().out
    assert "1 expected score(s) of this kind of CPU measured with graphs exported another way skipped" in out
    assert f"generation {EXPORT_GENERATION}" in out and "nothing measured" in out


@pytest.mark.parametrize("name", ["scores.toml", "trained.toml"])
def test_the_documented_figures_come_from_the_expected_file(name):
    table = markdown_table(load_expected(SCORES.parent / name))
    page = REPO / "docs" / "reference" / "expected-scores.md"
    assert table in page.read_text(), f"regenerate it in {page}: retr regress benchmarks/expected/{name} --markdown"


@pytest.mark.skipif(not (SHARED / "adi").is_dir() or not (SHARED / "cisi").is_dir(), reason="shared datasets absent")
def test_the_cheap_expected_scores_hold(capsys, monkeypatch):
    monkeypatch.delenv("RETR_INT8_DOT")  # this CPU as it is: its own expected figures
    assert main(["regress", str(SCORES), "--tier", "ci", "--datasets", str(SHARED), "--no-download"]) == 0, \
        capsys.readouterr().out


def test_trained_models_are_named_under_a_models_folder_and_reranked_figures_checked(
        tiny_dataset, tiny_bi_encoder, tiny_cross_encoder, tmp_path, capsys):
    entries = _measured_entries(tiny_dataset, tmp_path, ("hybrid", "hybrid+rerank"),
                                {"model": "bi", "reranker": "ce", "backend": "onnx"},
                                "--model", str(tiny_bi_encoder), "--backend", "onnx", "--reranker",
                                str(tiny_cross_encoder))
    assert entries[0]["value"] != entries[1]["value"]  # the reranker changes the ranking: its figure is checked
    models = tmp_path / "models"
    models.mkdir()
    (models / "bi").symlink_to(tiny_bi_encoder)
    (models / "ce").symlink_to(tiny_cross_encoder)
    path = tmp_path / "trained.toml"
    path.write_text(_toml(entries))
    capsys.readouterr()
    assert main(["regress", str(path), "--models", str(models)]) == 0
    assert "2 of 2 expected scores hold" in capsys.readouterr().out
    # without the models folder the names are no folders: refused before anything is measured, naming the entry
    assert main(["regress", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: [[expect]] #1" in err[0] and "'bi'" in err[0]
    # a +rerank entry with no reranker is refused as the file is read
    del entries[1]["options"]["reranker"]
    path.write_text(_toml(entries[1:]))
    assert main(["regress", str(path), "--models", str(models)]) == 2
    assert "needs a reranker" in capsys.readouterr().err


def test_a_figure_is_measured_through_the_graphs_it_was_measured_with_not_this_machines_choice(tiny_dataset,
                                                                                                 monkeypatch):
    """Which graphs encode documents and queries is measured per machine and depends on its cache; an expected
    figure is measured again through the graphs its kind names (documents: the calibrated default where the kind
    ends in +int8, else its base graph; queries: the documents' base graph), or those its options name."""
    import retr.eval.runner as runner
    from retr.eval.regress import Expected, graphs_of, measure

    def group(cpu, **options):
        return [Expected("d", "bm25", "NDCG@10", 0.5, 0.1, options=options),
                Expected("d", "dense", "NDCG@10", 0.5, 0.1, options=options, cpu=cpu)]

    assert graphs_of(group("bf16")) == ("openvino", "openvino") == graphs_of(group("fp32"))
    assert graphs_of(group("bf16+int8")) == ("openvino-int8", "openvino") == graphs_of(group("fp32+int8"))
    assert graphs_of(group("bf16", backend="onnx")) == ("onnx", "onnx")
    assert graphs_of(group("bf16+int8", query_backend="onnx-int8")) == ("openvino-int8", "onnx-int8")
    seen = []

    def fake_eval(ds, cfg):
        seen.append((cfg.encoder.backend, cfg.encoder.query_backend))
        raise RuntimeError("stop")

    monkeypatch.setattr(runner, "run_eval", fake_eval)
    with pytest.raises(RuntimeError, match="stop"):
        measure([Expected(str(tiny_dataset), "dense", "NDCG@10", 0.5, 0.1, cpu="bf16")])
    assert seen == [("openvino", "openvino")]
