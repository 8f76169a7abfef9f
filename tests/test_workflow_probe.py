"""The hostile probe of the everyday workflow (topics in, runs out, runs scored and compared): each defect it found,
as a case that fails without its fix."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest

from retr.cli.main import main
from retr.eval.data import load_qrels
from retr.eval.trec import read_run, write_run
from retr.retrieval.artifacts import atomic_write_text
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Run


def _qrels(tiny_dataset):
    return tiny_dataset / "qrels" / "test.tsv"


def _run(qrels, path, keep=lambda i, q: True, prefix="", tag_docs=lambda d: d):
    write_run(Run({prefix + q: [(tag_docs(d), 1.0) for d in qrels[q]] + [("zz-not-judged", 0.5)]
                   for i, q in enumerate(qrels) if keep(i, q)}), path)
    return path


# -- outputs -----------------------------------------------------------------------------------------------------
def test_an_output_that_is_a_device_or_fifo_is_written_into_never_replaced(tmp_path):
    """A file the user named (a run, a report): written into a device or FIFO, never replaced by a file."""
    null = tmp_path / "null"  # a null device of the test's own (as root /dev/null itself was replaced by a file)
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        null = None  # (no CAP_MKNOD: the FIFO below stands for every special file)
    if null is not None:
        atomic_write_text(null, "discarded\n", output=True)
        assert stat.S_ISCHR(os.stat(null).st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RetrError, match=r"a FIFO no process reads\): nothing written"):  # (would block for ever)
        atomic_write_text(fifo, "x", output=True)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write_text(fifo, "through the pipe\n", output=True)
        assert os.read(reader, 100) == b"through the pipe\n" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        os.close(reader)
    with pytest.raises(RetrError, match="is a folder: give the path of a file"):  # (an IsADirectoryError traceback)
        atomic_write_text(tmp_path, "x", output=True)
    # retr's own files (a cache entry) still replace whatever stands in their place: a FIFO there never blocks
    atomic_write_text(fifo, "a cache entry\n")
    assert stat.S_ISREG(os.stat(fifo).st_mode) and fifo.read_text() == "a cache entry\n"


def test_out_never_replaces_an_input(tiny_dataset, tmp_path, capsys):
    qrels_path = _qrels(tiny_dataset)
    run = _run(load_qrels(qrels_path), tmp_path / "r.trec")
    before = run.read_bytes()
    assert main(["eval", "--run", str(run), "--qrels", str(qrels_path), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run}: --out names the run read" in err and err.count("\n") == 1 and run.read_bytes() == before
    assert main(["compare", str(run), str(run), "--qrels", str(qrels_path), "--out", str(qrels_path)]) == 2
    assert "--out names the qrels read" in capsys.readouterr().err
    topics = tmp_path / "t.tsv"
    topics.write_text("q1\tsolar panels\n")
    assert main(["search", str(tmp_path / "no-index"), "--topics", str(topics), "--out", str(topics)]) == 2
    assert "--out names the topics read" in capsys.readouterr().err and topics.read_text() == "q1\tsolar panels\n"


def test_a_run_dir_that_is_a_file_is_refused_before_any_search(tiny_dataset, tiny_bi_encoder, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    t0 = time.perf_counter()
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25", "--run-dir", str(afile)]) == 2
    assert "the run files' folder (--run-dir) is a file" in capsys.readouterr().err
    assert afile.read_text() == "x" and time.perf_counter() - t0 < 30


# -- scoring -----------------------------------------------------------------------------------------------------
def test_query_ids_written_otherwise_warn_at_warning_level(tiny_dataset, tmp_path, caplog):
    qrels_path = _qrels(tiny_dataset)
    qrels = load_qrels(qrels_path)
    run = _run(qrels, tmp_path / "padded.trec", keep=lambda i, q: i % 2 == 0)
    write_run(Run({**{q: list(read_run(run)[q]) for q in read_run(run)},
                   **{"0" + q: [(d, 1.0) for d in qrels[q]] for i, q in enumerate(qrels) if i % 2}}), run)
    caplog.set_level(logging.WARNING, logger="retr")
    assert main(["-q", "eval", "--run", str(run), "--qrels", str(qrels_path)]) == 0
    assert "are the query ids written the same way?" in caplog.text


def test_a_huge_cut_off_scores_at_once_and_the_cli_bounds_it(tiny_dataset, tmp_path, capsys):
    from retr.eval.metrics import evaluate

    qrels = load_qrels(_qrels(tiny_dataset))
    run = read_run(_run(qrels, tmp_path / "r.trec"))
    t0 = time.perf_counter()
    deep = evaluate(run, qrels, [10, 10**12]).mean  # looped to k before: never returned
    assert time.perf_counter() - t0 < 5 and deep["Recall@1000000000000"] == 1.0
    assert deep["NDCG@1000000000000"] == evaluate(run, qrels, [10, 1000]).mean["NDCG@1000"]
    with pytest.raises(SystemExit):
        main(["eval", "--run", str(tmp_path / "r.trec"), "--qrels", str(_qrels(tiny_dataset)),
              "--k-values", "99999999999999999999"])
    assert "k values must be from 1 to 1,000,000" in capsys.readouterr().err
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25", "--k-values", "10,100000"]) == 2
    assert "a search returns at most 10,000 hits" in capsys.readouterr().err


def test_a_jsonl_run_naming_a_query_twice_is_refused_with_its_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"qid": "q1", "hits": [{"docid": "d1", "score": 1}]}\n'
                    '{"qid": "q2", "hits": []}\n{"qid": "q1", "hits": [{"docid": "d2", "score": 2}]}\n')
    with pytest.raises(RetrError, match=r"r.jsonl:3: query 'q1' again \(first at line 1\)"):
        read_run(path)


# -- compare -----------------------------------------------------------------------------------------------------
def test_reports_scored_against_other_judgements_are_not_compared(tiny_dataset, tmp_path, caplog, capsys):
    """Two qrels files of one name (another folder): their reports were paired as one dataset, a 'significant'
    loss that was a gain."""
    qrels_path = _qrels(tiny_dataset)
    qrels = load_qrels(qrels_path)
    other = tmp_path / "other" / "test.tsv"
    other.parent.mkdir()
    lines = qrels_path.read_text().splitlines()
    other.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # one judgement fewer
    run = _run(qrels, tmp_path / "r.trec")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["eval", "--run", str(run), "--qrels", str(qrels_path), "--out", str(a)]) == 0
    assert main(["eval", "--run", str(run), "--qrels", str(other), "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert "scored against 2 different sets of judgements" in caplog.text
    assert main(["compare", str(a), str(a.with_name("a2.json"))]) == 2  # (no such file: the usual error)
    a2 = tmp_path / "a2.json"
    a2.write_bytes(b"\xef\xbb\xbf" + a.read_bytes())  # a report an editor gave a byte-order mark: still a report
    assert main(["compare", str(a), str(a2)]) == 0


def test_runs_with_no_ranked_query_in_common_are_refused_and_some_in_common_warned(tiny_dataset, tmp_path, capsys,
                                                                                   caplog):
    qrels_path = _qrels(tiny_dataset)
    qrels = load_qrels(qrels_path)
    first = _run(qrels, tmp_path / "first.trec", keep=lambda i, q: i < 3)
    second = _run(qrels, tmp_path / "second.trec", keep=lambda i, q: i >= 3)
    assert main(["compare", str(first), str(second), "--qrels", str(qrels_path)]) == 2
    assert "ranked no judged query in common" in capsys.readouterr().err
    most = _run(qrels, tmp_path / "most.trec", keep=lambda i, q: i >= 1)
    assert main(["compare", str(first), str(most), "--qrels", str(qrels_path)]) == 0
    assert "a missing ranking counts 0" in caplog.text


def test_compare_reads_jsonl_runs_and_scores_the_cut_offs_its_metrics_name(tiny_dataset, tmp_path, capsys):
    qrels_path = _qrels(tiny_dataset)
    qrels = load_qrels(qrels_path)
    trec = _run(qrels, tmp_path / "base.trec")
    jsonl = tmp_path / "other.jsonl"
    write_run(read_run(trec), jsonl, "jsonl")  # read as a report before ('unreadable JSON')
    assert main(["compare", str(trec), str(jsonl), "--qrels", str(qrels_path), "--metrics", "NDCG@20,MAP@7"]) == 0
    out = capsys.readouterr().out
    assert "NDCG@20" in out and "MAP@7" in out
    assert main(["compare", str(trec), str(jsonl), "--qrels", str(qrels_path), "--metrics", ","]) == 2
    assert "no metric to compare" in capsys.readouterr().err  # (a TypeError traceback)
    assert main(["compare", str(trec), str(jsonl), "--qrels", str(qrels_path), "--metrics", "NDCG"]) == 2
    assert "give NAME@K" in capsys.readouterr().err


# -- readers -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "q1\t0\td1\t1\nq1\t0\td2\t0\nq2\t0\td3\t2\n",  # TREC qrels tab-separated (MS MARCO's): refused before
    "q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 2\n",
    "\nquery-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2\td3\t2\n",  # a header after a blank line
    "topic\tdoc\trel\nq1\td1\t1\nq1\td2\t0\nq2\td3\t2\n",  # a header named as topic files name it
])
def test_qrels_in_each_common_layout_read_alike(tmp_path, text):
    path = tmp_path / "qrels.txt"
    path.write_text(text)
    assert load_qrels(path).to_dict() == {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}}


def test_topics_are_refused_at_their_line_before_any_search(tmp_path, capsys):
    """A topic too long, an id holding a NUL or whitespace a TREC run cannot hold: refused naming the file (and
    line), before the index is even opened (the whitespace id was refused after the whole batch was searched)."""
    cases = {"long.tsv": ("1\t" + "x " * 60_000 + "\n", "long.tsv:1: topic '1' is longer than 100,000 characters"),
             "nul.tsv": ("1\x00\tsolar\n", "nul.tsv:1: topic id '1\\x00' holds a control character"),
             "space.tsv": ("q 1\tsolar\n", "space.tsv: topic id 'q 1' holds whitespace: a TREC run cannot hold it")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["search", str(tmp_path / "no-index"), "--topics", str(tmp_path / name),
                     "--out", str(tmp_path / "o.trec")]) == 2
        assert message in capsys.readouterr().err, name
    assert not (tmp_path / "o.trec").exists()
    assert main(["search", str(tmp_path / "no-index"), "--topics", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert f"{tmp_path}: a folder, not a topic file" in capsys.readouterr().err  # ('no such topic file')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RetrError, match="fifo: not a regular file"):
        load_qrels(fifo)


def test_the_api_names_a_bad_topic_by_its_id(built_tiny):
    with pytest.raises(RetrError, match=r"topics: topic id ' 1 ' has surrounding whitespace"):
        built_tiny.search_topics({"1": "solar", " 1 ": "wind"})
    with pytest.raises(RetrError, match=r"topics: topic id '1\\x00' holds a control character"):
        built_tiny.search_topics({"1\x00": "solar"})
    with pytest.raises(RetrError, match=r"topics: topic 'b' is longer than 100,000 characters"):
        built_tiny.search_topics({"a": "solar", "b": "x" * 100_001})  # ('queries[1] is longer ...')
    with pytest.raises(RetrError, match=r"topics: topic has no id"):
        built_tiny.search_topics({"": "solar"})


@pytest.fixture
def built_tiny(tiny_dataset, tiny_bi_encoder, tmp_path):
    import retr

    with retr.Index.build(tiny_dataset, tmp_path / "idx", model=str(tiny_bi_encoder), backend="onnx") as index:
        yield index


# -- the second probe (the surfaces changed the same day) ---------------------------------------------------------
def test_out_never_lies_in_the_dataset_or_index_read_and_its_folder_is_checked_first(tiny_dataset, tmp_path,
                                                                                     capsys):
    import shutil

    import retr

    data = tmp_path / "data"
    shutil.copytree(tiny_dataset, data)
    corpus = (data / "corpus.jsonl").read_bytes()
    assert main(["eval", "--dataset", str(data), "--modes", "bm25", "--out", str(data / "corpus.jsonl")]) == 2
    assert "--out lies in the dataset read" in capsys.readouterr().err and (data / "corpus.jsonl").read_bytes() == corpus
    with pytest.raises(RetrError, match="out lies in the dataset read"):  # the API alike (it replaced queries.jsonl)
        retr.evaluate(data, modes=["bm25"], out=data / "queries.jsonl")
    idx = tmp_path / "idx"
    idx.mkdir()
    topics = tmp_path / "t.tsv"
    topics.write_text("q1\tsolar\n")
    assert main(["search", str(idx), "--topics", str(topics), "--out", str(idx / "docstore.jsonl")]) == 2
    assert "--out lies in the index read" in capsys.readouterr().err and not (idx / "docstore.jsonl").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    assert main(["search", str(idx), "--topics", str(topics), "--out", str(blocked / "run.trec")]) == 2
    assert "cannot be written" in capsys.readouterr().err  # before the search, not a traceback after it


def test_fusion_depth_is_bounded_at_every_door(tmp_path, capsys):
    from retr.retrieval.pipeline import PipelineConfig
    from retr.serve.config import ServeConfig

    with pytest.raises(SystemExit):
        main(["search", str(tmp_path), "q", "--fusion-depth", "99999999999999999999"])
    assert "must be <= 10000" in capsys.readouterr().err
    with pytest.raises(RetrError, match="fusion depth 5000 is over this server's max k"):
        ServeConfig(pipeline=PipelineConfig(fusion_depth=5000))  # a request may ask at most max_k (1000)


def test_a_run_file_and_a_report_scored_against_the_same_judgements_are_compared(tiny_dataset, tmp_path, capsys,
                                                                                 caplog):
    """Grouped by their judgements, not by the names their files give them (the run's dataset was 'test', the
    report's 'tiny': each was compared with nothing, in silence)."""
    qrels_path = _qrels(tiny_dataset)
    qrels = load_qrels(qrels_path)
    report = tmp_path / "a.json"
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25", "--out", str(report)]) == 0
    run = _run(qrels, tmp_path / "perfect.trec")
    capsys.readouterr()
    assert main(["compare", str(report), str(run), "--qrels", str(qrels_path)]) == 0
    assert "a:bm25" in capsys.readouterr().out.split("perfect")[0]
    other = tmp_path / "other.tsv"
    other.write_text(qrels_path.read_text().replace("\t1\n", "\t2\n", 1))
    assert main(["compare", str(report), str(run), "--qrels", str(other)]) == 2  # nothing left to compare
    assert "perfect is compared with nothing" in caplog.text
