"""Topic files in (TSV, JSONL, BEIR queries.jsonl, TREC topics) and run files out and back (TREC, MS MARCO, JSONL);
`retr eval --run` scores a run as `retr eval --dataset` scores the same run, to the last digit."""

from __future__ import annotations

import json

import pytest

from retr.cli.main import main
from retr.eval.topics import read_topics
from retr.eval.trec import read_run, write_run
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Run

TREC_TOPICS = """<top>
<num> Number: 301
<title> International Organized Crime

<desc> Description:
Identify organizations that participate in international criminal activity.

<narr> Narrative:
A relevant document must name the organization.
</top>

<top>
<num>302</num>
<title>Topic: Poliomyelitis and Post-Polio</title>
<desc>Is the disease under control?</desc>
</top>
"""


def test_topics_in_every_form(tmp_path):
    tsv = tmp_path / "q.tsv"
    tsv.write_text("qid\tquery\n1\tsolar panels\n2\twind\tturbines\n\n", encoding="utf-8")
    assert read_topics(tsv) == {"1": "solar panels", "2": "wind\tturbines"}  # the text is all after the first tab

    jsonl = tmp_path / "topics"
    jsonl.write_text('{"qid": 7, "query": "a b"}\n{"id": "x", "title": "c"}\n', encoding="utf-8")
    assert read_topics(jsonl) == {"7": "a b", "x": "c"}

    beir = tmp_path / "queries.jsonl"
    beir.write_text('{"_id": "q1", "text": "how do solar panels work", "metadata": {}}\n', encoding="utf-8")
    assert read_topics(beir) == {"q1": "how do solar panels work"}

    trec = tmp_path / "topics.301-302.txt"
    trec.write_text(TREC_TOPICS, encoding="utf-8")
    assert read_topics(trec) == {"301": "International Organized Crime", "302": "Poliomyelitis and Post-Polio"}
    assert read_topics(trec, field="desc")["301"] == ("Identify organizations that participate in international "
                                                      "criminal activity.")
    assert list(read_topics(trec)) == ["301", "302"]  # file order


@pytest.mark.parametrize("name,content,message", [
    ("a.tsv", "1\tok\n2 no tab here\n", "a.tsv:2: expected 'id<TAB>query'"),
    ("a.tsv", "1\tok\n1\tagain\n", "a.tsv:2: duplicate topic id '1'"),
    ("a.tsv", "1\tok\n2\t  \n", "a.tsv:2: topic '2' has no query text"),
    # no searchable character (the search request's test): refused here, with the line, not by the search later
    ("a.tsv", "1\tok\n2\t\0\0\n", "a.tsv:2: topic '2' holds no searchable character"),
    ("a.jsonl", '{"id": "1", "text": "ok"}\n{"id": "2", "text": "\\u0007 \\u200b"}\n',
     "a.jsonl:2: topic '2' holds no searchable character"),
    ("t.txt", "<top>\n<num> 1\n<title> \x01\n</top>\n", "t.txt:1: topic '1' holds no searchable character"),
    ("a.jsonl", '{"id": "1", "text": "ok"}\n{"id": "2", "text": \n', "a.jsonl:2: malformed JSON"),
    ("a.jsonl", '{"id": "1", "body": "x"}\n', "a.jsonl:1: topic has no text field"),
    ("a.jsonl", '{"text": "x"}\n', "a.jsonl:1: topic has no id field"),
    ("a.jsonl", '["1", "x"]\n', "a.jsonl:1: expected a JSON object"),
    ("t.txt", "<top>\n<num> 1\n<title> a\n</top>\n\n<top>\n<title> b\n</top>\n", "t.txt:6: topic has no <num>"),
    ("t.txt", "<top>\n<num> 1\n<title> a\n</top>\n<top>\n<num> 2\n<title> b\n", "t.txt:5: a <top> without </top>"),
    ("t.txt", "<top>\n<num> 1\n<desc> a\n</top>\n", "t.txt:1: topic '1' has no <title>"),
    ("e.tsv", "\n\n", "e.tsv: holds no topic"),
    ("b.dat", "just words\n", "b.dat:1: not a topic file"),
])
def test_malformed_topics_name_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(RetrError) as e:
        read_topics(path)
    assert str(e.value).startswith(str(tmp_path / message.split(":")[0])) and message in str(e.value)
    assert "\n" not in str(e.value)


RUN = Run({"q1": [("d1", 2.5), ("d2", 0.1 + 0.2), ("d3", 0.30000000000000004)], "q2": [("d9", -1.0)], "q3": []})


@pytest.mark.parametrize("fmt", ["trec", "msmarco", "jsonl"])
def test_runs_written_and_read_back(tmp_path, fmt):
    path = tmp_path / f"run.{fmt}"
    write_run(RUN, path, fmt, tag="mytag")
    back = read_run(path)  # the form is detected
    if fmt == "msmarco":  # ranks only: the order comes back, scored -rank
        assert {q: [h.doc_id for h in hits] for q, hits in back.items()} == \
            {q: [h.doc_id for h in hits] for q, hits in RUN.items() if hits}
        assert [h.score for h in back["q1"]] == [-1.0, -2.0, -3.0]
    elif fmt == "trec":
        assert back == {q: hits for q, hits in RUN.items() if hits}  # exact scores (repr); no line for no hit
        assert path.read_text().splitlines()[0] == "q1 Q0 d1 1 2.5 mytag"
    else:
        assert back == RUN  # the query without hits is kept
        assert json.loads(path.read_text().splitlines()[0])["tag"] == "mytag"


@pytest.mark.parametrize("fmt,content,message", [
    ("trec", "q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 x t\n", "run.txt:2: score 'x' is not a number"),
    ("trec", "q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 0.4\n", "run.txt:2: a TREC run line needs 6 fields"),
    ("trec", "q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", "run.txt:2: query 'q1' lists document 'd1' twice"),
    ("msmarco", "q1\td1\t1\nq1\td2\t0\n", "run.txt:2: rank '0' is not a positive integer"),
    ("jsonl", '{"qid": "q1", "hits": [{"docid": "d1"}]}\n', "run.txt:1: a hit is"),
])
def test_malformed_runs_name_file_and_line(tmp_path, fmt, content, message):
    path = tmp_path / "run.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(RetrError, match=message):
        read_run(path)


def test_a_run_that_a_format_cannot_hold_is_refused_and_nothing_written(tmp_path):
    path = tmp_path / "run.trec"
    with pytest.raises(RetrError, match="doc id 'a b' is empty or holds whitespace"):
        write_run(Run({"q": [("a b", 1.0)]}), path)
    with pytest.raises(RetrError, match="run tag 'my tag'"):
        write_run(RUN, path, tag="my tag")
    assert not path.exists()
    write_run(Run({"q": [("a b", 1.0)]}), path, "jsonl")  # JSONL holds any id
    assert read_run(path)["q"][0].doc_id == "a b"


def test_a_run_is_written_as_its_lines_come_and_a_bad_line_late_in_it_leaves_the_old_file(tmp_path, monkeypatch):
    """A run file is streamed to its temporary file a batch of lines at a time (a 300,000-line run is never held
    as one string and its bytes), and still replaces the old file in one rename: a line refused after some batches
    were written leaves the old file as it was and no temporary file behind."""
    from retr.retrieval import artifacts

    monkeypatch.setattr(artifacts.atomic_write_lines, "__defaults__", (3, False))  # batches of 3 lines
    path = tmp_path / "run.trec"
    path.write_text("old\n", encoding="utf-8")
    many = Run({f"q{i}": [(f"d{j}", float(10 - j)) for j in range(4)] for i in range(5)})
    seen_on_disk = []
    real = artifacts._atomic_write

    def watched(target, write, durable=False, output=False):
        def spy(fh):
            class Handle:  # what the temporary file holds each time a batch is written
                def write(self, data):
                    fh.write(data)
                    fh.flush()
                    seen_on_disk.append(max((p.stat().st_size for p in tmp_path.glob(".run.trec.*.tmp")), default=0))
            write(Handle())
        real(target, spy, durable, output)

    monkeypatch.setattr(artifacts, "_atomic_write", watched)
    write_run(many, path)
    assert len(seen_on_disk) == 7 and seen_on_disk == sorted(seen_on_disk) and seen_on_disk[0] < seen_on_disk[-1]
    assert read_run(path) == many
    bad = Run({**{q: list(h) for q, h in many.items()}, "zz": [("a b", 1.0)]})  # refused on its last line
    with pytest.raises(RetrError, match="doc id 'a b'"):
        write_run(bad, path)
    assert read_run(path) == many and not list(tmp_path.glob(".run.trec.*"))


def test_eval_run_scores_as_eval_dataset_does(tmp_path, tiny_dataset, tiny_bi_encoder, capsys):
    """A run written by `retr eval --dataset`, scored again by `retr eval --run`: every metric and per-query value
    equal to the last digit; `retr compare` scores it with the same scorer."""
    from retr.eval.compare import systems_from
    from retr.eval.data import load_qrels
    from retr.eval.report import EvalReport

    report_path, runs = tmp_path / "report.json", tmp_path / "runs"
    assert main(["eval", "--dataset", str(tiny_dataset), "--modes", "bm25", "--model", str(tiny_bi_encoder),
                 "--out", str(report_path), "--run-dir", str(runs), "--warmup", "0"]) == 0
    first = EvalReport.read(report_path).pipelines["bm25"]
    capsys.readouterr()
    qrels = tiny_dataset / "qrels" / "test.tsv"
    again_path = tmp_path / "again.json"
    assert main(["eval", "--run", first.run_file, "--qrels", str(qrels), "--out", str(again_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"runs scored against {qrels}: 6 judged queries (made elsewhere: no latency measured)"
    assert "p50 ms" not in out and "index MB" not in out
    again = EvalReport.read(again_path)
    (name, scored), = again.pipelines.items()
    assert name == "tiny.test.bm25" and scored.metrics == first.metrics and scored.per_query == first.per_query
    # `retr compare` scores the same file with the same scorer
    system, = systems_from([first.run_file], load_qrels(qrels), "test")
    assert system.per_query == first.per_query


def test_eval_run_input_errors(tmp_path, tiny_dataset, capsys):
    run = tmp_path / "r.trec"
    write_run(Run({"zz": [("d1", 1.0)]}), run)
    assert main(["eval", "--run", str(run)]) != 0
    assert "--run needs --qrels" in capsys.readouterr().err
    assert main(["eval", "--run", str(run), "--qrels", str(tiny_dataset / "qrels" / "test.tsv")]) != 0
    assert "share no query id" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one source at a time
        main(["eval", "--run", str(run), "--dataset", str(tiny_dataset)])
    assert "not allowed with argument" in capsys.readouterr().err
    # document ids written otherwise than the qrels' (a prefix): scored (0), with a warning saying why
    from retr.eval.data import load_qrels

    qrels = load_qrels(tiny_dataset / "qrels" / "test.tsv")
    write_run(Run({q: [("doc-" + d, 1.0) for d in qrels[q]] for q in qrels}), run)
    assert main(["eval", "--run", str(run), "--qrels", str(tiny_dataset / "qrels" / "test.tsv")]) == 0
    err = capsys.readouterr().err
    assert "none of its" in err and "are the document ids written the same way?" in err
    write_run(Run({q: [(d, 1.0) for d in qrels[q]] for q in qrels}), run)  # the same ids: no warning
    assert main(["eval", "--run", str(run), "--qrels", str(tiny_dataset / "qrels" / "test.tsv")]) == 0
    assert "written the same way" not in capsys.readouterr().err


def test_topic_and_run_readers_check_the_file_and_its_form_alike(tmp_path):
    from retr.eval.trec import read_run

    present = tmp_path / "f.tsv"
    present.write_text("1\tx\n", encoding="utf-8")
    for read, what, forms in ((read_topics, "topic", "tsv, jsonl, trec"), (read_run, "run", "trec, msmarco, jsonl")):
        with pytest.raises(RetrError, match=f"missing: no such {what} file"):
            read(tmp_path / "missing")
        with pytest.raises(RetrError, match=f"^{what} format 'xml': choose one of {forms}$"):
            read(present, "xml")


def test_scoring_a_run_shallower_than_a_cut_off_says_how_deep_it_is(tiny_dataset, tmp_path, caplog, capsys):
    run = tmp_path / "shallow.trec"
    run.write_text("".join(f"{q} Q0 {d} {r} {4 - r} x\n" for q in ("q1", "q2")
                           for r, d in enumerate(("d1", "d2", "d3"), start=1)))
    qrels = str(tiny_dataset / "qrels" / "test.tsv")
    with caplog.at_level("WARNING", logger="retr"):
        assert main(["eval", "--run", str(run), "--qrels", qrels, "--k-values", "1,3,10,100"]) == 0
    said = [r.getMessage() for r in caplog.records if "deep" in r.getMessage()]
    assert said == [f"{run} is 3 deep (at most 3 hits per query): @10, @100 count only those"], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="retr"):
        assert main(["eval", "--run", str(run), "--qrels", qrels, "--k-values", "1,3"]) == 0
    assert not [r for r in caplog.records if "deep" in r.getMessage()]
