"""Loading corpora, queries, qrels and datasets: every bad input is a one-line error naming file:line."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pytest

from retr.eval.data import download_beir, load_dataset, load_qrels, resolve_dataset
from retr.indexes.corpus import CorpusFormat, load_corpus
from retr.retrieval.errors import RetrError


def _write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_beir_corpus_loads_with_checksum_and_empty_docs_counted(tiny_dataset):
    corpus = load_corpus(tiny_dataset)
    assert len(corpus) == 16 and corpus.empty_docs == 1
    assert corpus.docs[0].full_text() == "Solar power Solar panels convert sunlight into electricity using photovoltaic cells."
    assert load_corpus(tiny_dataset / "corpus.jsonl").sha256 == corpus.sha256
    assert len(corpus.sha256) == 64


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = _write(tmp_path / "c.jsonl", '{"_id": "1", "text": "ok"}\n{"_id": "2", "text": oops}\n')
    with pytest.raises(RetrError, match=r"c\.jsonl:2: malformed JSON"):
        load_corpus(p)


def test_duplicate_ids_name_both_lines(tmp_path):
    p = _write(tmp_path / "c.jsonl", '{"_id": "1", "text": "a"}\n{"_id": "2", "text": "b"}\n{"_id": "1", "text": "c"}\n')
    with pytest.raises(RetrError, match=r"c\.jsonl:3: duplicate document id '1' \(first seen at line 1\)"):
        load_corpus(p)


def test_non_utf8_names_line(tmp_path):
    p = _write(tmp_path / "c.jsonl", b'{"_id": "1", "text": "a"}\n{"_id": "2", "text": "caf\xe9"}\n')
    with pytest.raises(RetrError, match=r"c\.jsonl:2: not valid UTF-8"):
        load_corpus(p)


def test_missing_id_field_and_missing_file(tmp_path):
    p = _write(tmp_path / "c.jsonl", '{"doc": "1", "text": "a"}\n')
    with pytest.raises(RetrError, match=r"c\.jsonl:1: no id field among '_id', 'id'.* the records have 'doc', 'text'"):
        load_corpus(p)
    p = _write(tmp_path / "c2.jsonl", '{"_id": "1", "text": "a"}\n{"text": "b"}\n')
    with pytest.raises(RetrError, match=r"c2\.jsonl:2: record has no '_id' field"):
        load_corpus(p)
    with pytest.raises(RetrError, match="no such file"):
        load_corpus(tmp_path / "nope.jsonl")


def test_user_jsonl_and_csv_with_chosen_fields(tmp_path):
    p = _write(tmp_path / "mine.jsonl", '{"id": 7, "body": "hello world", "name": "Greeting"}\n')
    c = load_corpus(p, CorpusFormat("id", "body", "name"))
    assert c.docs[0].doc_id == "7" and c.docs[0].title == "Greeting" and c.docs[0].text == "hello world"
    p = _write(tmp_path / "mine.csv", 'id,body\n1,"a, quoted text"\n2,plain\n')
    c = load_corpus(p, CorpusFormat("id", "body", None))
    assert [d.text for d in c.docs] == ["a, quoted text", "plain"]
    p = _write(tmp_path / "bad.csv", "id,body\n1,a,extra\n")
    with pytest.raises(RetrError, match=r"bad\.csv:2: more fields"):
        load_corpus(p, CorpusFormat("id", "body", None))


def test_qrels_errors_and_trec_format(tmp_path):
    p = _write(tmp_path / "q.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n")
    with pytest.raises(RetrError, match=r"q\.tsv:3: expected"):
        load_qrels(p)
    p = _write(tmp_path / "q.trec", "q1 0 d1 2\nq2 0 d3 0\n")
    assert load_qrels(p).to_dict() == {"q1": {"d1": 2}, "q2": {"d3": 0}}


def test_qrels_naming_unknown_docs_or_queries_are_counted_and_skipped(tiny_dataset, tmp_path, caplog):
    folder = tmp_path / "ds"
    folder.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        (folder / name).write_bytes((tiny_dataset / name).read_bytes())
    (folder / "qrels").mkdir()
    _write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\tNOPE\t1\nqX\td2\t1\n")
    ds = load_dataset(str(folder), "test", download=False)
    assert ds.qrels.to_dict() == {"q1": {"d1": 1}}
    assert (ds.check.unknown_docs, ds.check.unknown_queries) == (1, 1)
    assert list(ds.queries) == ["q1"]
    assert "not in the corpus" in caplog.text and "not in the queries file" in caplog.text


def test_missing_split_lists_available(tiny_dataset):
    with pytest.raises(RetrError, match=r"splits here: test"):
        load_dataset(str(tiny_dataset), "dev", download=False)


def test_dataset_name_resolves_under_retr_data(tiny_dataset, monkeypatch, tmp_path):
    monkeypatch.setenv("RETR_DATA", str(tiny_dataset.parent))
    assert resolve_dataset("tiny") == tiny_dataset
    with pytest.raises(RetrError, match=r"put its BEIR folder .* at .*nothere"):
        resolve_dataset("nothere", download=False)
    # a name BEIR publishes no zip for is never looked for on the network (here it would fail: no urlopen allowed)
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: pytest.fail("tried to download"))
    with pytest.raises(RetrError, match=r"'cranfield' not found under .*no download of that name.*RETR_DATA"):
        resolve_dataset("cranfield")


def _zip_of(folder) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                zf.write(f, f"tiny/{f.relative_to(folder)}")
    return buf.getvalue()


def test_download_verifies_md5_and_leaves_nothing_on_mismatch(tiny_dataset, tmp_path):
    blob = _zip_of(tiny_dataset)
    zpath = _write(tmp_path / "tiny.zip", blob)
    home = tmp_path / "home"
    with pytest.raises(RetrError, match="does not match the published"):
        download_beir("tiny", home, url=zpath.as_uri(), md5="0" * 32)
    assert not (home / "tiny").exists() and not list(home.glob("*.zip"))
    out = download_beir("tiny", home, url=zpath.as_uri(), md5=hashlib.md5(blob).hexdigest())
    assert (out / "corpus.jsonl").is_file() and (out / "qrels" / "test.tsv").is_file()
    assert load_dataset(str(out)).qrels.num_relevant("q1") == 2


def test_unreachable_download_says_where_to_put_the_data(tmp_path):
    with pytest.raises(RetrError, match=r"could not be downloaded .* put its BEIR folder at"):
        download_beir("tiny", tmp_path, url=(tmp_path / "absent.zip").as_uri())
    assert not (tmp_path / "tiny").exists()


def test_queries_jsonl_errors(tmp_path):
    from retr.eval.data import load_queries

    p = _write(tmp_path / "queries.jsonl", json.dumps({"_id": "1", "text": "a"}) + "\n[1, 2]\n")
    with pytest.raises(RetrError, match=r"queries\.jsonl:2: expected a JSON object"):
        load_queries(p)


def test_plain_id_text_jsonl_indexes_with_no_flags_and_says_which_fields(tmp_path, caplog):
    caplog.set_level("INFO")
    p = _write(tmp_path / "mine.jsonl", '{"id": 1, "text": "hello"}\n{"id": 2, "text": "world", "title": "T"}\n')
    c = load_corpus(p)
    assert [d.doc_id for d in c.docs] == ["1", "2"] and c.docs[1].text == "world" and c.docs[1].title == ""
    assert c.fields == {"id": "id", "text": "text", "title": None}
    assert "fields used: id 'id', text 'text'" in caplog.text
    p = _write(tmp_path / "contents.jsonl", '{"docid": "a", "contents": "x y", "title": "t"}\n')
    assert load_corpus(p).fields == {"id": "docid", "text": "contents", "title": "title"}


def test_ambiguous_fields_are_refused(tmp_path):
    p = _write(tmp_path / "amb.jsonl", '{"id": 1, "_id": "x", "text": "hello"}\n')
    with pytest.raises(RetrError, match=r"amb\.jsonl: records have both '_id' and 'id'.* --id-field"):
        load_corpus(p)
    p = _write(tmp_path / "amb2.jsonl", '{"id": 1, "text": "a", "body": "b"}\n')
    with pytest.raises(RetrError, match=r"both 'text' and 'body'.* --text-field"):
        load_corpus(p)
    assert load_corpus(p, CorpusFormat(text_field="body")).docs[0].text == "b"


def test_a_wrong_text_field_is_refused_naming_the_fields_the_records_have(tmp_path):
    rows = "".join(json.dumps({"_id": str(i), "body": f"doc {i}", "title": ""}) + "\n" for i in range(5))
    p = _write(tmp_path / "c.jsonl", rows)
    with pytest.raises(RetrError, match=r"5 of 5 documents would have no text: field 'txt' is missing from 5 of them; "
                                        r"the records have '_id', 'body', 'title'"):
        load_corpus(p, CorpusFormat(text_field="txt"))


@pytest.mark.parametrize("record,what", [
    ({"_id": "1", "text": ["a", "b"]}, r"field 'text' holds a JSON list"),
    ({"_id": "1", "text": {"a": 1}}, r"field 'text' holds a JSON dict"),
    ({"_id": True, "text": "a"}, r"id field '_id' holds a JSON bool"),
    ({"_id": "1", "text": "a", "title": ["t"]}, r"field 'title' holds a JSON list"),
])
def test_texts_and_ids_of_the_wrong_json_type_are_errors(tmp_path, record, what):
    p = _write(tmp_path / "c.jsonl", json.dumps({"_id": "0", "text": "ok", "title": ""}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(RetrError, match=rf"c\.jsonl:2: {what}"):
        load_corpus(p)


@pytest.mark.parametrize("grade", ["0.4", "inf", "nan", "-inf", "1.5"])
def test_non_integer_grades_are_refused_with_file_and_line(tmp_path, grade):
    p = _write(tmp_path / "q.tsv", f"query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t{grade}\n")
    with pytest.raises(RetrError, match=rf"q\.tsv:3: relevance '{grade}' is not an integer grade"):
        load_qrels(p)
    assert load_qrels(_write(tmp_path / "ok.tsv", "q1\td1\t2.0\n")).to_dict() == {"q1": {"d1": 2}}


def test_beir_tsv_ids_with_spaces_are_read_by_tab(tmp_path):
    p = _write(tmp_path / "q.tsv", "query-id\tcorpus-id\tscore\nq 1\td 1\t1\n")
    assert load_qrels(p).to_dict() == {"q 1": {"d 1": 1}}


def test_a_dataset_with_nothing_scoreable_is_an_error(tiny_dataset, tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        (folder / name).write_bytes((tiny_dataset / name).read_bytes())
    (folder / "qrels").mkdir()
    _write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\tNOPE\t1\nqX\td2\t1\n")
    with pytest.raises(RetrError, match=r"test\.tsv: nothing to score.*\(1 judged queries are not among the queries, "
                                        r"1 judgements name documents not in the corpus"):
        load_dataset(str(folder), "test", download=False)


@pytest.mark.parametrize("split", ["../../x", "a/b", "..", ".hidden", ""])
def test_split_names_that_would_escape_are_refused(tiny_dataset, split):
    with pytest.raises(RetrError, match=r"split .*: use letters, digits"):
        load_dataset(str(tiny_dataset), split, download=False)


def test_a_zip_member_escaping_the_target_folder_is_refused(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("evil/corpus.jsonl", '{"_id": "1", "text": "a"}\n')
        zf.writestr("../escaped.txt", "gotcha")
    blob = buf.getvalue()
    zpath = _write(tmp_path / "evil.zip", blob)
    home = tmp_path / "home" / "data"
    with pytest.raises(RetrError, match=r"zip member '\.\./escaped\.txt' escapes the target folder"):
        download_beir("evil", home, url=zpath.as_uri(), md5=hashlib.md5(blob).hexdigest())
    assert not (home / "evil").exists() and not (home.parent / "escaped.txt").exists()
    assert not list(home.glob("*.zip"))


@pytest.mark.parametrize("text", ["   ", "\x00\u200b", "\t\x07"])
def test_a_judged_query_without_searchable_text_is_refused_naming_its_line(tmp_path, text):  # issue 41, case 6
    from .conftest import QUERIES, write_beir

    folder = write_beir(tmp_path / "ds", queries={**QUERIES, "q3": text})
    with pytest.raises(RetrError, match=r"ds/queries\.jsonl:3: query 'q3' has no searchable text .* test\.tsv "
                                        r"judges it \(1 such query\)"):
        load_dataset(str(folder), "test", download=False)
    unjudged = write_beir(tmp_path / "ok", queries={**QUERIES, "q9": text})  # not judged: never searched
    assert "q9" not in load_dataset(str(unjudged), "test", download=False).queries


def test_conflicting_duplicate_grades_warn_naming_both_lines(tmp_path, caplog):  # issue 41, case 6
    p = _write(tmp_path / "q.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t1\nq1\td1\t0\nq1\td2\t1\n")
    with caplog.at_level("WARNING", logger="retr.eval.data"):
        assert load_qrels(p).to_dict() == {"q1": {"d1": 0, "d2": 1}}  # the last grade, as before
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith(f"{p}:4: query 'q1', document 'd1' judged 0 here but 2 at "
                                                     f"line 2")


def test_an_empty_id_is_reported_as_empty_not_missing(tmp_path):  # issue 41, case 22
    p = _write(tmp_path / "c.jsonl", '{"_id": "1", "text": "a"}\n{"_id": "", "text": "b"}\n')
    with pytest.raises(RetrError, match=r"c\.jsonl:2: empty document id \(field '_id' is ''\)"):
        load_corpus(p)
    p = _write(tmp_path / "c2.jsonl", '{"_id": "1", "text": "a"}\n{"_id": "  ", "text": "b"}\n')
    with pytest.raises(RetrError, match=r"c2\.jsonl:2: empty document id"):
        load_corpus(p)
