"""`--dataset irds:<id>`: documents, queries and qrels through ir_datasets, from a dataset registered in the test
from local files (never a download); the same report as the BEIR folder of the same data; clear one-line errors."""

from __future__ import annotations

import sys
from typing import NamedTuple

import pytest

from retr.cli.main import main
from retr.retrieval.errors import RetrError

from .conftest import DOCS, QRELS, QUERIES, write_beir

ir_datasets = pytest.importorskip("ir_datasets")


class TitledDoc(NamedTuple):
    doc_id: str
    title: str
    text: str
    topic: str


def _register(tmp_path, name: str, docs_file=None) -> str:
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    docs = tmp_path / "docs.tsv"
    docs.write_text("".join(f"{d}\t{t}\t{x}\t{'energy' if d in ('d1', 'd2', 'd3') else 'other'}\n"
                            for d, t, x in DOCS), encoding="utf-8")
    queries = tmp_path / "queries.tsv"
    queries.write_text("".join(f"{q}\t{t}\n" for q, t in QUERIES.items()), encoding="utf-8")
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, ds in QRELS.items() for d, g in ds.items()), encoding="utf-8")
    dataset_id = f"retr-test/{name}"
    if dataset_id not in ir_datasets.registry:
        ir_datasets.registry.register(dataset_id, Dataset(
            TsvDocs(LocalDownload(docs_file or docs), doc_cls=TitledDoc), TsvQueries(LocalDownload(queries)),
            TrecQrels(LocalDownload(qrels), {})))
    return dataset_id


def test_irds_dataset_loads_as_the_beir_folder_of_the_same_data(tmp_path, monkeypatch):
    from retr.eval.data import load_dataset

    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "irds-home"))
    ds = load_dataset(f"irds:{_register(tmp_path, 'tiny')}")
    beir = load_dataset(str(write_beir(tmp_path / "tiny")))
    assert ds.name == "retr-test_tiny" and ds.split == "irds"
    assert [(d.doc_id, d.title, d.text) for d in ds.corpus.docs] == [(d.doc_id, d.title, d.text) for d in beir.corpus.docs]
    assert ds.corpus.docs[0].metadata == {"topic": "energy"}  # other fields are metadata, usable in filters
    assert ds.queries == beir.queries and ds.qrels == beir.qrels


def test_eval_irds_gives_the_report_of_the_beir_folder(tmp_path, monkeypatch, tiny_bi_encoder):
    from retr.eval.report import EvalReport

    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "irds-home"))
    dataset_id = _register(tmp_path, "tiny-eval")
    beir = write_beir(tmp_path / "tiny")
    metrics = {}
    for spec in (f"irds:{dataset_id}", str(beir)):
        out = tmp_path / "report.json"
        assert main(["eval", "--dataset", spec, "--modes", "bm25,dense", "--model", str(tiny_bi_encoder),
                     "--warmup", "0", "--out", str(out)]) == 0
        report = EvalReport.read(out)
        metrics[spec] = {n: p.per_query for n, p in report.pipelines.items()}
    assert metrics[f"irds:{dataset_id}"] == metrics[str(beir)]


def test_irds_errors_are_one_line(tmp_path, monkeypatch, capsys):
    from retr.eval.data import load_dataset

    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "irds-home"))
    with pytest.raises(RetrError, match="ir_datasets has no dataset 'retr-test/nope'"):
        load_dataset("irds:retr-test/nope")
    with pytest.raises(RetrError, match="name an ir_datasets id after irds:"):
        load_dataset("irds:")
    # a collection ir_datasets cannot provide (here: its file is gone; offline, a download fails the same way)
    gone = _register(tmp_path, "gone", docs_file=tmp_path / "missing.tsv")
    with pytest.raises(RetrError, match=r"ir_datasets could not provide the documents of 'retr-test/gone' .*offline"):
        load_dataset(f"irds:{gone}")
    # the package absent: what to install
    monkeypatch.setitem(sys.modules, "ir_datasets", None)
    assert main(["eval", "--dataset", "irds:beir/scifact/test"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("[retr]")]
    assert err == ["retr: error: --dataset irds:...: the optional ir_datasets package is not installed "
                   "(pip install ir_datasets, or pip install 'retr[irds]')"]
