"""One checked search request at every door (issues 38 and 41): the same defaults and the same hits from the CLI,
the API and the service; hostile API inputs are one-line RetrErrors (property-tested with Hypothesis), never
another exception, and nothing is changed or written when they are refused."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retr
from retr.cli.main import main
from retr.retrieval.errors import RetrError
from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE, SearchRequest

# any value a caller may hand a parameter: right and wrong types, edge numbers, hostile text
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=True),
    st.text(max_size=12), st.binary(max_size=6), st.lists(st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.text(max_size=4), st.integers(), st.none()), max_size=3),
    st.tuples(st.integers()), st.sampled_from(["bm25", "dense", "hybrid", "minmax", "rrf", "maxp", "10", "", " ",
                                               "\x00", "\u200b", "solar", "d1", object()]),
)
UNSEARCHABLE = ["", "   ", "\t\n", "\x00", "\x00\x00 \x07", "\u200b\u200c\u200d", "\ufeff", "\u2028\x1f"]
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def built(tiny_dataset, tiny_bi_encoder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("request") / "idx"
    retr.Index.build(tiny_dataset, folder, model=str(tiny_bi_encoder), backend="onnx").close()
    return folder


@pytest.fixture(scope="module")
def index(built):
    with retr.Index.load(built, backend="onnx") as opened:
        yield opened


# -- the value itself -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options,field", [
    ({"k": "10"}, "k must be a whole number"), ({"k": None}, "k must be a whole number"),
    ({"k": 10.7}, "k must be a whole number"), ({"k": True}, "k must be a whole number"),
    ({"k": 0}, "k must be from 1"), ({"k": 10**9}, "k must be from 1"),
    ({"mode": None}, "mode: a pipeline is a str"), ({"mode": "colbert"}, "mode: pipeline 'colbert', position 1"),
        ({"mode": "hybrid+rerank"}, "mode 'hybrid\\+rerank' needs a cross-encoder"),
    ({"filter": "x"}, "filter must be a mapping"), ({"filter": {"lang": ["en"]}}, r"filter\['lang'\] must be"),
    ({"filter": {3: "x"}}, "filter: a field name must be"), ({"rerank": 3}, r"rerank must be a non-empty str \(MODEL_DIR\) or None"),
    ({"fusion": "mean"}, "fusion must be one of"), ({"passage_aggregate": 1}, "passage_aggregate must be one of"),
    ({"depth": 3}, "unknown search option 'depth'"),
])
def test_a_bad_option_is_one_line_naming_its_field(options, field):
    with pytest.raises(RetrError, match=field) as e:
        SearchRequest.one("solar", **options)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("query", UNSEARCHABLE)
def test_queries_without_a_searchable_character_are_refused(query):  # issue 41, case 7
    with pytest.raises(RetrError, match="no searchable characters"):
        SearchRequest.one(query)
    with pytest.raises(RetrError, match=r"queries\[1\]"):
        SearchRequest.batch(["solar", query])
    assert SearchRequest.one(f"{query}solar{query}").queries == (f"{query}solar{query}",)


def test_a_str_is_never_a_list_of_queries_and_defaults_live_in_one_place():
    with pytest.raises(RetrError, match="queries must be a list of str, got 'ab'"):
        SearchRequest.batch("ab")
    with pytest.raises(RetrError, match="query must be a str"):
        SearchRequest.one(["ab"])
    req = SearchRequest.batch(("a", "b"), filter={})
    assert (req.queries, req.k, req.mode, req.filter, str(req.pipeline)) == (("a", "b"), 10, "hybrid", None, "hybrid")
    assert (DEFAULT_K, DEFAULT_MODE) == (10, "hybrid")
    # every door shows the same default: the CLI's parser, the API's signatures
    from inspect import signature

    from retr.cli.main import build_parser

    parsed = build_parser().parse_args(["search", "idx", "q"])
    assert (parsed.mode, parsed.k) == (DEFAULT_MODE, DEFAULT_K)
    for method in (retr.Index.search, retr.Index.search_batch):
        params = signature(method).parameters
        assert (params["mode"].default, params["k"].default) == (DEFAULT_MODE, DEFAULT_K)


@PROPERTY
@given(query=ANY, k=ANY, mode=ANY, rerank=ANY, filter_=ANY, fusion=ANY, aggregate=ANY)
def test_any_request_value_is_a_request_or_a_retr_error(query, k, mode, rerank, filter_, fusion, aggregate):
    for make in (SearchRequest.one, SearchRequest.batch):
        try:
            make(query, k=k, mode=mode, rerank=rerank, filter=filter_, fusion=fusion, passage_aggregate=aggregate)
        except RetrError as e:
            assert "\n" not in str(e)


# -- the API's doors: search, search_batch, delete, build, evaluate ----------------------------------------------
def test_hostile_api_inputs_are_one_line_errors(index, built, tiny_dataset, tiny_bi_encoder, tmp_path):  # case 20
    cases = [
        (lambda: index.search("solar", k="10"), "k must be a whole number"),
        (lambda: index.search("solar", k=None), "k must be a whole number"),
        (lambda: index.search("solar", k=10.7), "k must be a whole number"),
        (lambda: index.search("solar", mode=None), "mode: a pipeline is a str"),
        (lambda: index.search("solar", filter="x"), "filter must be a mapping"),
        (lambda: index.search_batch("ab"), "queries must be a list of str"),  # case 1
        (lambda: retr.Index.build(tiny_dataset, tmp_path / "a", shards="2"), "shards must be a whole number"),
        (lambda: retr.Index.build(tiny_dataset, tmp_path / "b", passages=128), "passages must be a str"),
        (lambda: retr.Index.build(tiny_dataset, tmp_path / "c", kind="hnsw", hnsw_m=-5),  # case 8
         r"hnsw_m \(--hnsw-m\) must be from 2 to 256, got -5"),
        (lambda: retr.Index.build(tiny_dataset, tmp_path / "d", ef_search=1.5), "ef_search"),
        (lambda: retr.evaluate(tiny_dataset, k_values="10"), "k_values must be a list"),
        (lambda: retr.evaluate(tiny_dataset, modes="bm25"), r"modes must be a list of str.*\[.bm25.\]"),
        (lambda: retr.Index.load(built, fusion=None), "fusion must be one of"),
    ]
    for call, message in cases:
        with pytest.raises(RetrError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    assert not any((tmp_path / name).exists() for name in "abcd")  # refused before anything was written


def test_delete_of_a_str_is_refused_not_read_as_letters(built, tmp_path):  # case 1
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(built, folder)
    with retr.Index.load(folder, backend="onnx") as index:
        before = index.ids
        with pytest.raises(RetrError, match=r"ids must be a list of str, got 'd1'.*\['d1'\]"):
            index.delete("d1")
        with pytest.raises(RetrError, match=r"ids\[1\] must be a str"):
            index.delete(["d2", 3])
        assert index.ids == before
        index.delete(["d1"])
        assert "d1" not in index.ids and len(index.ids) == len(before) - 1


def test_a_closed_index_refuses_every_call(built):  # case 25
    index = retr.Index.load(built, backend="onnx")
    assert index.search("solar", k=2).hits
    index.close()
    for call in (lambda: index.search("solar"), lambda: index.search_batch(["solar"]), lambda: index.delete(["d1"]),
                 lambda: index.add(built), lambda: index.compact(), lambda: index.ids):
        with pytest.raises(RetrError, match="this Index was closed"):
            call()
    assert index.closed
    index.close()  # twice is harmless
    with retr.Index.load(built, backend="onnx") as again:
        assert "d1" in again.ids


def test_evaluate_refuses_an_out_whose_folder_is_missing(tiny_dataset, tiny_bi_encoder, tmp_path):  # case 26
    out = tmp_path / "no" / "such" / "r.json"
    with pytest.raises(RetrError, match=r"out: .*no/such is not an existing folder"):
        retr.evaluate(tiny_dataset, modes=["bm25"], out=out)
    with pytest.raises(RetrError, match="run_dir: .* is not an existing folder"):
        retr.evaluate(tiny_dataset, modes=["bm25"], run_dir=tmp_path / "none" / "runs")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _or_valid(valid) -> st.SearchStrategy:
    """Right values as often as any value: most examples get past the first check to the search itself."""
    return st.one_of(valid, ANY)


@PROPERTY
@given(query=_or_valid(st.text(min_size=1, max_size=30)), k=_or_valid(st.integers(1, 40)),
       mode=_or_valid(st.sampled_from(["bm25", "dense", "hybrid"])),
       filter_=_or_valid(st.one_of(st.none(), st.dictionaries(st.sampled_from(["topic", "n", "x"]),
                                                              st.one_of(st.text(max_size=6), st.integers(),
                                                                        st.floats(), st.booleans()),
                                                              max_size=2))),
       fusion=_or_valid(st.sampled_from([None, "minmax", "zscore", "rrf"])))
def test_any_search_argument_gives_hits_or_a_retr_error(index, query, k, mode, filter_, fusion):
    for search in (index.search, index.search_batch):
        try:
            out = search(query, k=k, mode=mode, filter=filter_, fusion=fusion)
        except RetrError as e:
            assert "\n" not in str(e)
        else:
            results = out if isinstance(out, list) else [out]
            assert all(len(r.hits) <= r.k for r in results)


@PROPERTY
@given(value=ANY, name=st.sampled_from(["hnsw_m", "ef_search", "nlist", "pq_nbits", "nprobe", "lean_m", "seed",
                                        "kind", "shards", "passages", "passage_aggregate", "bm25", "use_cache", "backend",
                                        "max_length", "executor", "ray_actors", "id_field", "model"]))
def test_any_build_argument_is_refused_or_reaches_the_corpus(tmp_path, value, name):
    # a corpus that does not exist: every check runs first, so the only other answer is "no such file"
    try:
        retr.Index.build(tmp_path / "missing.jsonl", tmp_path / "out", **{name: value})
    except RetrError as e:
        assert "\n" not in str(e)
    assert not (tmp_path / "out").exists()


@PROPERTY
@given(value=ANY, name=st.sampled_from(["modes", "k_values", "split", "warmup", "fusion", "fusion_depth", "kind", "out",
                                        "run_dir", "rerank", "rerank_depth", "passages", "passage_aggregate",
                                        "download", "backend"]))
def test_any_evaluate_argument_is_refused_or_reaches_the_dataset(tmp_path, value, name):
    try:
        retr.evaluate(tmp_path / "missing", **{"download": False, name: value})
    except RetrError as e:
        assert "\n" not in str(e)


@PROPERTY
@given(value=ANY, name=st.sampled_from(["folder", "model", "backend", "query_backend", "fusion", "query_prompt"]))
def test_any_load_argument_opens_or_is_a_retr_error(built, value, name):
    try:
        opened = retr.Index.load(**{"folder": built, "backend": "onnx", name: value})
    except RetrError as e:
        assert "\n" not in str(e)
    else:
        opened.close()


@PROPERTY
@given(value=ANY, name=st.sampled_from(["corpus", "id_field", "text_field", "title_field"]))
def test_any_add_argument_is_refused_or_reaches_the_corpus(index, tmp_path, value, name):
    before = index.ids
    try:
        index.add(**{"corpus": tmp_path / "missing.jsonl", name: value})
    except RetrError as e:
        assert "\n" not in str(e)
    assert index.ids == before


@PROPERTY
@given(ids=ANY, missing_ok=ANY)
def test_any_delete_argument_is_refused_or_deletes_what_it_names(built, tmp_path_factory, ids, missing_ok):
    import shutil

    folder = tmp_path_factory.mktemp("del") / "idx"
    shutil.copytree(built, folder)
    index = retr.Index.load(folder, backend="onnx")
    before = set(index.ids)
    try:
        index.delete(ids, missing_ok=missing_ok)
    except RetrError as e:
        assert "\n" not in str(e)
        assert set(index.ids) == before
    else:
        assert set(index.ids) == before - set(ids)
    index.close()


def test_a_requests_fusion_and_aggregate_are_those_of_an_index_opened_with_them(built, index, tiny_dataset,
                                                                               tiny_bi_encoder, tmp_path):
    query = "solar electricity for the night"
    with retr.Index.load(built, backend="onnx", fusion="rrf") as rrf:
        want = [(h.id, h.score) for h in rrf.search(query).hits]
    got = [(h.id, h.score) for h in index.search(query, fusion="rrf").hits]
    assert got == want and got != [(h.id, h.score) for h in index.search(query).hits]
    # the fusion depth alike: a request's, or the one an index was opened with (min-max over the top 2, not 100)
    with retr.Index.load(built, backend="onnx", fusion_depth=2) as shallow:
        want = [(h.id, h.score) for h in shallow.search(query, k=2).hits]
    got = [(h.id, h.score) for h in index.search(query, k=2, fusion_depth=2).hits]
    assert got == want and got != [(h.id, h.score) for h in index.search(query, k=2).hits]
    assert [(h.id, h.score) for h in index.search(query, k=2, fusion_depth=100).hits] == \
        [(h.id, h.score) for h in index.search(query, k=2).hits]  # 100: the searcher's own
    folder = tmp_path / "passages"
    with retr.Index.build(tiny_dataset, folder, model=str(tiny_bi_encoder), backend="onnx", passages="8:4",
                          bm25=False) as passages:
        by = {agg: [(h.id, h.score) for h in passages.search(query, mode="dense", passage_aggregate=agg).hits]
              for agg in ("maxp", "sum")}
    assert by["maxp"] != by["sum"]
    with retr.Index.load(folder, backend="onnx") as again:  # the index's own aggregate: maxp
        assert [(h.id, h.score) for h in again.search(query, mode="dense").hits] == by["maxp"]


# -- the CLI and the service ------------------------------------------------------------------------------------
def test_the_cli_refuses_unsearchable_queries(built, capsys):  # case 7
    for query in ("\x00\x00", "\u200b\u200b", " \t "):
        assert main(["search", str(built), query, "--backend", "onnx"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no searchable characters" in err[0]


def test_cli_api_and_service_give_the_same_hits_with_no_options(built, index, capsys):  # issue 38
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    from .serving import Server

    query = "where do wolves live"
    api = index.search(query)
    assert main(["search", str(built), query, "--json", "--backend", "onnx"]) == 0
    cli = json.loads(capsys.readouterr().out)
    server = Server(built, ServeConfig(encoder=EncoderConfig(backend="onnx")))
    try:
        status, served = server.request("/search", {"query": query})
        bad, refused = server.request("/search", {"query": "\x00\u200b"})
    finally:
        server.stop()
    want = [(h.id, round(h.score, 5)) for h in api.hits]
    assert len(want) == DEFAULT_K and api.pipeline == DEFAULT_MODE
    assert [(h["id"], round(h["score"], 5)) for h in cli["results"]] == want and cli["pipeline"] == DEFAULT_MODE
    assert status == 200 and [(h["id"], round(h["score"], 5)) for h in served["results"]] == want
    assert served["pipeline"] == DEFAULT_MODE
    assert 400 <= bad < 500 and "searchable" in json.dumps(refused)  # case 7 at the service's door


def test_a_byte_order_mark_in_an_ids_file_is_not_part_of_the_first_id(built, tmp_path, capsys):  # case 21
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(built, folder)
    ids = tmp_path / "ids.txt"
    ids.write_bytes("d1\r\nd2\n".encode("utf-8-sig"))
    assert main(["delete", str(folder), "--ids", str(ids)]) == 0, capsys.readouterr().err
    with retr.Index.load(folder, backend="onnx") as index:
        assert {"d1", "d2"}.isdisjoint(index.ids) and len(index.ids) == 14


# -- index parameters and FAISS ---------------------------------------------------------------------------------
def _index_args(tiny_dataset, tiny_bi_encoder) -> list[str]:
    return ["index", "--corpus", str(tiny_dataset), "--model", str(tiny_bi_encoder), "--backend", "onnx",
            "--kind", "ivfpq"]


def test_nlist_above_the_corpus_size_is_one_line(tiny_dataset, tiny_bi_encoder, tmp_path, capfd):  # case 18
    assert main([*_index_args(tiny_dataset, tiny_bi_encoder), "--out", str(tmp_path / "a"), "--nlist", "1000"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == ("retr: error: --nlist 1000: more lists than the 16 vectors to cluster; give at most 16, "
                       "or 0 to choose from the corpus size")
    assert not (tmp_path / "a").exists()


def test_faiss_clustering_warning_goes_through_the_logger(tiny_dataset, tiny_bi_encoder, tmp_path, capfd,
                                                         caplog):  # case 24
    with caplog.at_level(logging.WARNING, logger="retr.indexes.dense"):
        assert main([*_index_args(tiny_dataset, tiny_bi_encoder), "--out", str(tmp_path / "b"), "--nlist", "2"]) == 0
    assert "WARNING clustering" not in capfd.readouterr().err  # FAISS's own print, past logging
    assert any("16 training vectors for 2 centroids" in r.getMessage() for r in caplog.records)


def test_a_request_is_a_hashable_value_whose_filter_keeps_its_types():
    one = SearchRequest.one("solar", filter={"n": 1, "lang": "en"})
    assert one == SearchRequest.one("solar", filter={"lang": "en", "n": 1}) and len({one, SearchRequest.one(
        "solar", filter={"lang": "en", "n": 1})}) == 1
    assert one != SearchRequest.one("solar", filter={"n": True, "lang": "en"})  # 1 and true filter differently
    with pytest.raises(TypeError):
        one.filter["n"] = 2  # read-only
    with pytest.raises(AttributeError):
        one.k = 3  # frozen
