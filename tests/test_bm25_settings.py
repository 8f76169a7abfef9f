"""BM25 as a user sets it: k1, b, the variant and the language score as bm25s scores with the same settings, are
recorded in the manifest and the report, and a German collection is searched with German stemming and stopwords."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retr.cli.main import main
from retr.retrieval.bm25 import METHODS, BM25Config, BM25Retriever
from retr.retrieval.errors import RetrError

from .conftest import DOCS, QUERIES, write_beir

# a small German collection: inflected forms (Häuser/Haus, Bäume/Baum, Kinder/Kind) meet only when stemmed
GERMAN_DOCS = [
    ("g1", "Das Haus", "Das alte Haus steht am Rand der Stadt und hat einen großen Garten."),
    ("g2", "Bäume", "Im Wald wachsen viele Bäume, vor allem Buchen und Eichen."),
    ("g3", "Der Baum", "Ein einzelner Baum kann hundert Jahre alt werden."),
    ("g4", "Kinder", "Die Kinder spielen am Nachmittag auf dem Spielplatz."),
    ("g5", "Schule", "In der Schule lernt jedes Kind lesen, schreiben und rechnen."),
    ("g6", "Flüsse", "Große Flüsse wie der Rhein fließen in die Nordsee."),
    ("g7", "Katzen", "Katzen schlafen gern in der Sonne auf dem Fensterbrett."),
    ("g8", "Hunde", "Der Hund bellt, wenn jemand an der Tür klingelt."),
    ("g9", "Bücher", "In der Bibliothek stehen tausende Bücher in hohen Regalen."),
    ("g10", "Äpfel", "Im Herbst pflücken wir Äpfel von den Bäumen im Garten."),
    ("g11", "Städte", "Viele Städte wachsen, weil Menschen Arbeit suchen."),
    ("g12", "Brot", "Der Bäcker backt das Brot früh am Morgen."),
]
GERMAN_QUERIES = {"q1": "Häuser", "q2": "ein Kind", "q3": "Bäume", "q4": "der Hund und die Katze"}
GERMAN_QRELS = {"q1": {"g1": 1}, "q2": {"g5": 1}, "q3": {"g3": 1, "g2": 1}, "q4": {"g7": 1, "g8": 1}}


def _retriever(tmp_path, texts, cfg: BM25Config) -> BM25Retriever:
    from retr.indexes.bm25 import build_bm25

    folder = tmp_path / f"bm25-{cfg.method}-{cfg.k1}-{cfg.b}-{cfg.language}"
    build_bm25(texts, folder, cfg)
    return BM25Retriever(folder, [f"d{i}" for i in range(len(texts))])


def _bm25s_scores(texts, queries, cfg: BM25Config) -> np.ndarray:
    """bm25s itself, set the same way: one row of document scores per query."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer(cfg.stemmer) if cfg.stemmer else None
    stop = cfg.stopwords or []
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, delta=cfg.delta, method=cfg.method)
    model.index(bm25s.tokenize(texts, stopwords=stop, stemmer=stemmer, show_progress=False), show_progress=False)
    rows = []
    for q in queries:
        terms = bm25s.tokenize([q], stopwords=stop, stemmer=stemmer, return_ids=False, show_progress=False)[0]
        known = [t for t in terms if t in model.vocab_dict]
        rows.append(model.get_scores(known) if known else np.zeros(len(texts)))
    return np.array(rows)


SETTINGS = [BM25Config(), *(BM25Config(k1=0.9, b=0.4, method=m) for m in METHODS),
            BM25Config(method="bm25+", delta=1.0), BM25Config(method="bm25l", k1=1.2, b=1.0, delta=0.3),
            BM25Config(k1=0.0, b=0.0), BM25Config.for_language("none")]


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_scores_equal_bm25s_with_the_same_settings(tmp_path, cfg):
    texts = [f"{title} {text}".strip() for _, title, text in DOCS]
    queries = list(QUERIES.values())
    retriever = _retriever(tmp_path, texts, cfg)
    expected = _bm25s_scores(texts, queries, cfg)
    for qi, q in enumerate(queries):
        hits = retriever.search({"q": q}, k=len(texts))["q"]
        positive = np.flatnonzero(expected[qi] > 0)
        assert {h.doc_id for h in hits} == {f"d{i}" for i in positive}, q  # every document bm25s scores > 0
        for h in hits:
            assert h.score == pytest.approx(float(expected[qi][int(h.doc_id[1:])]), rel=1e-6), (q, h)


def test_settings_change_scores_and_defaults_are_unchanged(tmp_path):
    assert BM25Config() == BM25Config.for_language("english")
    d = BM25Config()
    assert (d.k1, d.b, d.method, d.stemmer, d.stopwords) == (1.5, 0.75, "lucene", "english", "en")
    texts = [f"{title} {text}".strip() for _, title, text in DOCS]
    query = {"q": QUERIES["q1"]}
    base = _retriever(tmp_path, texts, d).search(query, 5)["q"]
    for other in (BM25Config(k1=0.5), BM25Config(b=0.1), BM25Config(method="bm25+")):
        scores = _retriever(tmp_path, texts, other).search(query, 5)["q"]
        assert [h.score for h in scores] != [h.score for h in base], other


@pytest.mark.parametrize("kwargs,message", [
    ({"method": "bm26"}, "BM25 method 'bm26': choose one of lucene"),
    ({"b": 1.5}, r"BM25 b must be in \[0, 1\], got 1.5"),
    ({"k1": -1.0}, r"BM25 k1 must be in \[0, 100\], got -1"),
    ({"k1": float("nan")}, r"BM25 k1 must be a finite number in \[0, 100\], got nan"),
    ({"k1": 1e30}, r"BM25 k1 must be in \[0, 100\], got 1e\+30"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(RetrError, match=message):
        BM25Config(**kwargs)


def test_languages_and_their_stopwords():
    fr = BM25Config.for_language("french")
    assert (fr.stemmer, fr.stopwords) == ("french", "fr")
    fi = BM25Config.for_language("finnish")  # a stemmer, but bm25s has no Finnish stopword list
    assert (fi.stemmer, fi.stopwords) == ("finnish", None)
    with pytest.raises(RetrError, match="BM25 language 'klingon': choose one of arabic"):
        BM25Config.for_language("klingon")


def test_german_collection_end_to_end(tmp_path, tiny_bi_encoder, capsys):
    """`retr eval` and `retr index` / `retr search` with --bm25-language german: stemming finds the inflected forms
    the English analyzer misses; the settings are in the manifest and the report."""
    from retr.eval.report import EvalReport

    data = write_beir(tmp_path / "deutsch", GERMAN_DOCS, GERMAN_QUERIES, GERMAN_QRELS)
    ndcg = {}
    for language in ("english", "german"):
        out = tmp_path / f"{language}.json"
        assert main(["eval", "--dataset", str(data), "--modes", "bm25", "--model", str(tiny_bi_encoder),
                     "--bm25-language", language, "--bm25-k1", "1.2", "--warmup", "0", "--out", str(out)]) == 0
        report = EvalReport.read(out)
        assert report.config["bm25"]["stemmer"] == language and report.config["bm25"]["k1"] == 1.2
        assert report.index["manifest"]["bm25"]["params"]["stemmer"] == language
        ndcg[language] = report.pipelines["bm25"].per_query
    assert ndcg["german"]["q1"]["NDCG@10"] == 1.0 and ndcg["english"]["q1"]["NDCG@10"] == 0.0  # Häuser: Haus
    assert ndcg["german"]["q3"]["Recall@10"] == 1.0 and ndcg["english"]["q3"]["Recall@10"] == 0.5  # Bäume: Baum

    index = tmp_path / "idx"
    assert main(["index", "--corpus", str(data), "--out", str(index), "--model", str(tiny_bi_encoder),
                 "--bm25-language", "german", "--bm25-method", "bm25+", "--bm25-delta", "0.8", "--bm25-b", "0.5"]) == 0
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["bm25"]["params"] == {"k1": 1.5, "b": 0.5, "method": "bm25+", "stemmer": "german",
                                          "stopwords": "de", "delta": 0.8}
    capsys.readouterr()
    assert main(["search", str(index), "Häuser", "--mode", "bm25", "--json", "-k", "3"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"]
    assert hits[0]["id"] == "g1"  # "Häuser" stems to "haus", as "Haus" does


def test_bad_bm25_options_exit_with_one_line(tmp_path, tiny_bi_encoder, capsys):
    data = write_beir(tmp_path / "deutsch", GERMAN_DOCS, GERMAN_QUERIES, GERMAN_QRELS)
    assert main(["index", "--corpus", str(data), "--out", str(tmp_path / "idx"), "--bm25-language", "klingon"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("[retr]")]
    assert len(err) == 1 and "BM25 language 'klingon'" in err[0]
    assert not (tmp_path / "idx").exists()
