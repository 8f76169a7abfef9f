"""What a cross-encoder reads of a document (retr.retrieval.focus)."""

from pathlib import Path

import pytest

from retr.retrieval.backends.batching import plain_tokenizer
from retr.retrieval.errors import RetrError
from retr.retrieval.focus import PAIR_SPECIAL_TOKENS, check_inputs, make_focus, sentences

DOC = ("Solar power in deserts. Panels are made of silicon wafers. Dust storms reduce the output of panels. "
       "Tea grows on hillsides in the rain. Cleaning robots remove dust from solar panels every night. "
       "Markets for tea are volatile.")


def _tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def test_sentences_split_at_ends_followed_by_a_new_sentence():
    assert sentences(DOC)[:3] == ["Solar power in deserts.", "Panels are made of silicon wafers.",
                                  "Dust storms reduce the output of panels."]
    assert sentences("e.g. values near 3.5 mg. Then more") == ["e.g. values near 3.5 mg.", "Then more"]


@pytest.mark.parametrize("max_length", [24, 32, 48])
def test_a_long_document_keeps_its_lead_then_the_sentences_sharing_most_query_terms_in_order(tiny_cross_encoder,
                                                                                              max_length):
    tok = plain_tokenizer(Path(tiny_cross_encoder))
    focus = make_focus(tok, max_length)
    query = "dust on solar panels"
    (got,) = focus.texts(query, [DOC])
    budget = max_length - PAIR_SPECIAL_TOKENS - _tokens(tok, query)
    parts = sentences(DOC)
    kept = sentences(got)
    assert set(kept) <= set(parts) and kept[0] == parts[0]  # the lead first, nothing made up
    assert [parts.index(x) for x in kept] == sorted(parts.index(x) for x in kept)  # the document's order
    assert sum(_tokens(tok, x) for x in kept) <= budget < _tokens(tok, DOC)
    # no sentence left out could have fitted while holding more query terms than one kept
    terms = set(focus.terms(query))
    left = [x for x in parts if x not in kept]
    hits = {x: len(terms & set(focus.terms(x))) for x in parts}
    room = budget - sum(_tokens(tok, x) for x in kept)
    for x in left:
        if _tokens(tok, x) <= room:
            pytest.fail(f"{x!r} fits but was left out")
        assert all(hits[x] <= hits[y] or _tokens(tok, x) > budget - sum(
            _tokens(tok, z) for z in kept if z != y) for y in kept[1:]), x
    assert "Dust storms reduce the output of panels." in kept or "Cleaning robots remove dust from solar panels " \
        "every night." in kept


def test_a_document_that_fits_or_has_one_sentence_is_read_whole(tiny_cross_encoder):
    focus = make_focus(plain_tokenizer(Path(tiny_cross_encoder)), 512)
    assert focus.texts("dust", [DOC]) == [DOC]
    one = "dust " * 300
    assert make_focus(plain_tokenizer(Path(tiny_cross_encoder)), 32).texts("dust", [one]) == [one]


def test_query_terms_match_as_bm25_matches_them(tiny_cross_encoder):
    tok = plain_tokenizer(Path(tiny_cross_encoder))
    lead, other, target = "Alpha beta gamma delta.", "Running fast matters.", "Cleaned panels shine brightly."
    query = "the cleaning"
    # room for the lead and one more sentence of the two
    length = PAIR_SPECIAL_TOKENS + _tokens(tok, query) + _tokens(tok, lead) + _tokens(tok, target)
    assert _tokens(tok, other) <= _tokens(tok, target)
    # stemmed: "cleaning" matches "Cleaned"; the stopword "the" matches nothing (else both would tie)
    assert make_focus(tok, length).texts(query, [f"{lead} {other} {target}"]) == [f"{lead} {target}"]
    assert make_focus(tok, length).texts("the", [f"{lead} {other} {target}"]) == [f"{lead} {other}"]


def test_an_unknown_input_form_is_refused():
    assert check_inputs("focused") == "focused"
    with pytest.raises(RetrError, match="unknown cross-encoder input form 'middle'"):
        check_inputs("middle")


def test_a_check_of_a_focused_model_is_stored_apart_and_head_checks_keep_their_keys():
    from retr.retrieval.rerank import CorpusCheck

    args = ("c" * 64, "r" * 64, "m" * 64, 20, 128, 200, 7)
    assert CorpusCheck.key(*args) == CorpusCheck.key(*args, "head")  # checks stored before the forms still match
    assert CorpusCheck.key(*args, "focused") != CorpusCheck.key(*args)


def test_a_reranker_reads_as_its_model_was_trained_unless_told_otherwise(tiny_cross_encoder, tmp_path):
    import json
    import shutil

    from retr.retrieval.rerank import DEFAULT_RERANK_MAX_LENGTH, CrossEncoderReranker, RerankConfig

    path = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder, path)

    def opened(record: dict | None, **options) -> CrossEncoderReranker:
        if record is not None:
            (path / "retr_manifest.json").write_text(json.dumps(record))
        return CrossEncoderReranker(RerankConfig(model=str(path), **options))

    plain = opened(None)  # not trained by retr: 256 tokens of the head
    assert (plain.max_length, plain.inputs) == (min(DEFAULT_RERANK_MAX_LENGTH, 128), "head")
    trained = opened({"config": {"max_length": 48}, "inputs": "focused"})
    assert (trained.max_length, trained.inputs) == (48, "focused")
    long = "Tea leaves are dried. " * 10 + "Solar panels convert sunlight."
    (read,) = trained.read("solar panels", [long])
    assert read != long and read.endswith("Solar panels convert sunlight.")
    told = opened(None, max_length=32, inputs="head")
    assert (told.max_length, told.inputs) == (32, "head") and told.read("solar", [long]) == [long]
    with pytest.raises(RetrError, match="unknown cross-encoder input form 'tail'"):
        opened({"inputs": "tail"})


def test_a_document_seen_before_is_not_measured_again_and_reads_the_same(tiny_cross_encoder):
    from retr.retrieval.focus import Focus

    base = make_focus(plain_tokenizer(Path(tiny_cross_encoder)), 24)
    counted: list[list[str]] = []

    def count(texts):
        counted.append(list(texts))
        return base.count(texts)

    focus = Focus(count, base.terms, 24)
    first = focus.texts("dust on solar panels", [DOC, "One sentence only"])
    docs_measured = [t for call in counted for t in call if t in sentences(DOC)]
    assert docs_measured == sentences(DOC)  # every sentence measured once, in one call with the others
    counted.clear()
    assert focus.texts("dust on solar panels", [DOC, "One sentence only"]) == first
    assert counted == [["dust on solar panels"]]  # only the query: the document's sentences were kept
    assert focus.texts("tea markets", [DOC]) != first[:1]  # kept per document, chosen per query
