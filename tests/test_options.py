"""Every search option declared once (retr.retrieval.options.OPTIONS): the CLI, the API's signatures and keyword
check and the HTTP body are made from that table, so an option added there shows up at each of its doors; old
option names still work, with a warning; a value out of bounds is a one-line error at every door."""

from __future__ import annotations

import argparse
import inspect

import pytest

import retr
from retr.cli import surface
from retr.cli.main import build_parser, main
from retr.retrieval import options
from retr.retrieval.errors import RetrError
from retr.retrieval.request import SearchRequest
from retr.serve.body import http_model


def _parser(command: str) -> argparse.ArgumentParser:
    return dict(surface.parsers(build_parser()))[command]


def _api(self, query, **opts):
    return opts


def test_every_declared_option_is_at_each_of_its_doors_with_its_default():
    body = http_model().model_json_schema()["properties"]
    api = inspect.signature(retr.Index.search).parameters
    for o in options.OPTIONS:
        for door in o.doors:
            if door == "api":
                assert api[o.name].default == o.default, o.name
            elif door == "http":
                assert o.name in body and body[o.name].get("default") == (False if o.http is bool else o.default)
            else:
                action = _parser(door)._option_string_actions[o.cli_flag]
                assert action.dest == o.name and action.help == o.help, (door, o.name)
                assert action.default == (o.inherits if o.inherits is not None else o.default or action.default)
        for door in set(options.DOORS) - set(o.doors) - {"api", "http"}:
            action = _parser(door)._option_string_actions.get(o.cli_flag)
            assert action is None or action.help is argparse.SUPPRESS, (door, o.name)  # at most an old name there


def test_a_new_declaration_shows_up_in_the_cli_help_the_api_check_and_the_http_schema(monkeypatch, capsys):
    new = options.Declared("temperature", int, 3, "how warm the ranking is, a test option", ("search", "api", "http"),
                           low=1, high=9)
    monkeypatch.setattr(options, "OPTIONS", (*options.OPTIONS, new))
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "--temperature N how warm the ranking is, a test option (default: 3)" in " ".join(
        capsys.readouterr().out.split())
    assert vars(build_parser().parse_args(["search", "idx", "q", "--temperature", "5"]))["temperature"] == 5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["search", "idx", "q", "--temperature", "10"])
    assert "argument --temperature: '10' must be <= 9" in capsys.readouterr().err
    options.check_keywords({"temperature": 5})  # the API takes it ...
    with pytest.raises(RetrError, match="unknown search option 'temprature': did you mean 'temperature'"):
        options.check_keywords({"temprature": 5})
    assert inspect.signature(options.with_options(_api)).parameters["temperature"].default == 3
    field = http_model().model_json_schema()["properties"]["temperature"]  # ... and so does the service
    assert (field["default"], field["minimum"], field["maximum"]) == (3, 1, 9)
    assert "temperature" not in {a.dest for a in _parser("eval")._actions}  # not a door it declared


def test_the_api_takes_the_options_by_position_and_by_name():
    search = options.with_options(_api)
    assert search(None, "q", 3, "bm25") == {"k": 3, "mode": "bm25"}
    assert search(None, "q", fusion_depth=5) == {"fusion_depth": 5}
    with pytest.raises(TypeError, match="multiple values for argument 'k'"):
        search(None, "q", 3, k=4)
    with pytest.raises(RetrError, match="unknown search option 'depth': did you mean 'fusion_depth'"):
        search(None, "q", depth=3)
    params = list(inspect.signature(retr.Index.search).parameters)
    assert params[:6] == ["self", "query", "k", "mode", "rerank", "filter"]


@pytest.mark.parametrize("argv,message", [
    (["-k", "0"], "argument -k: '0' must be >= 1"),
    (["-k", "10001"], "argument -k: '10001' must be <= 10000"),
    (["--fusion-depth", "0"], "argument --fusion-depth: '0' must be >= 1"),
    (["--fusion", "max"], "argument --fusion: invalid choice: 'max'"),
    (["--filter", "lang"], "argument --filter: 'lang': a filter is FIELD=VALUE"),
])
def test_bounds_are_refused_at_the_cli_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["search", "idx", "q", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"retr search: error: {message}")


@pytest.mark.parametrize("given,message", [
    ({"k": 0}, "k must be from 1 to 10000, got 0"),
    ({"k": True}, "k must be a whole number from 1 to 10000"),
    ({"fusion_depth": 10_001}, "fusion_depth must be from 1 to 10000, got 10001"),
    ({"fusion": "max"}, "fusion must be one of minmax, zscore, rrf or None"),
    ({"passage_aggregate": "avg"}, "passage_aggregate must be one of maxp, firstp, sum or None"),
    ({"mode": "colbert"}, "mode: pipeline 'colbert'"),
])
def test_bounds_are_refused_at_the_api_with_one_line(given, message):
    with pytest.raises(RetrError) as e:
        SearchRequest.one("solar", **given)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_http_body_refuses_what_the_table_bounds():
    from pydantic import ValidationError

    body = http_model(max_k=50, max_query_chars=20, max_batch=2, inherited={"fusion": "rrf"})
    assert body(query="solar").options() == {"k": 10, "mode": body(query="solar").mode, "rerank": False,
                                             "filter": None, "fusion": None, "fusion_depth": None,
                                             "passage_aggregate": None}
    assert "this server's, rrf" in body.model_json_schema()["properties"]["fusion"]["description"]
    for bad in ({"k": 51}, {"fusion_depth": 0}, {"passage_aggregate": "avg"}, {"mode": "colbert"},
                {"queries": ["a", "b", "c"]}, {"query": "x" * 21}, {"rerank": "yes"}):
        with pytest.raises(ValidationError):
            body(**{"query": "solar", **bad} if "queries" not in bad else bad)


@pytest.mark.parametrize("old,new,argv,dest,value", [
    ("--rerank", "--check-reranker", ["index", "--corpus", "c", "--out", "o"], "check_reranker", "ce"),
    ("--mode", "--modes", ["eval", "--dataset", "d"], "pipelines", "bm25,dense"),
    ("--pipelines", "--mode", ["search", "idx", "q"], "mode", "bm25"),
])
def test_old_spellings_warn_and_still_work(old, new, argv, dest, value, capsys, monkeypatch):
    monkeypatch.setattr(surface, "_warned", set())
    args = build_parser().parse_args([*argv, old, value])
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == f"retr: warning: {old} is deprecated; use {new}\n"
