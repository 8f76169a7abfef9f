"""The command line as a whole: every option has help that shows its default, one concept has one visible name
across all commands (old names are hidden aliases that warn once and do the same), `retr --version`, and the
generated CLI reference is current."""

from __future__ import annotations

import argparse
from importlib import metadata

import pytest

from retr.cli import surface
from retr.cli.main import build_parser, main
from retr.cli.reference import REGENERATE, render

from .conftest import REPO

# concept -> (its one visible name, every name a user might know it by). An option string in the second set other
# than the first may exist only as a hidden deprecated alias of the first (surface.DEPRECATED); an old name may be
# another concept's visible name in a command that does not have its new one (`--mode`: eval's old `--modes`).
CONCEPTS = {
    "cross-encoder folder that reranks": ("--rerank", {"--rerank", "--reranker", "--cross-encoder", "--rerank-model"}),
    "check a cross-encoder on the corpus": ("--check-reranker", {"--check-reranker"}),
    "one pipeline to run (bm25, dense, hybrid, each +rerank)": ("--mode", {"--mode", "--pipeline", "--pipelines"}),
    "the pipelines to measure, a list": ("--modes", {"--modes"}),
    "a document's score from its passages'": ("--passage-aggregate", {"--passage-aggregate", "--aggregate"}),
    "bi-encoder": ("--model", {"--model", "--encoder", "--bi-encoder", "--encoder-model"}),
    "hits returned": ("-k", {"-k", "--k", "--top-k", "--topk", "--hits"}),
    "file or folder a command writes": ("--out", {"--out", "--output", "-o", "--output-dir"}),
    "relevance judgements": ("--qrels", {"--qrels", "--judgements", "--judgments"}),
    "queries read from a file": ("--topics", {"--topics", "--queries", "--topics-file"}),
    "dataset split": ("--split", {"--split", "--subset"}),
    "random seed": ("--seed", {"--seed", "--random-seed"}),
    "documents read from a file": ("--corpus", {"--corpus", "--documents", "--collection"}),
    "filter on a document field": ("--filter", {"--filter", "--where", "--filters"}),
    "fusion of two rankings": ("--fusion", {"--fusion", "--fusion-method", "--fuse"}),
    "metric cut-offs": ("--k-values", {"--k-values", "--cutoffs", "--ks"}),
}

# a sample value for each option that deprecated aliases point to, valid in every command that has it
SAMPLE = {"--rerank": "ce-folder", "--check-reranker": "ce-folder", "--mode": "bm25", "--modes": "bm25,dense",
          "--passage-aggregate": "sum", "--out": "result.json"}
RENAMED = sorted((old, new) for old, names in surface.DEPRECATED.items() for new in names)


def _aliases(p: argparse.ArgumentParser) -> dict[str, str]:
    """A parser's hidden old names -> the visible name each stands for."""
    return {old: a.canonical.option_strings[-1] for old, a in p._option_string_actions.items()
            if isinstance(a, surface._DeprecatedAlias)}


def _actions(parser: argparse.ArgumentParser):
    """(command, parser, action) for every option and positional of every command, help/version/subcommands aside."""
    for name, p in surface.parsers(parser):
        for a in p._actions:
            if not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                yield name or "retr", p, a


def _visible(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS


def _required_in_group(p: argparse.ArgumentParser, action: argparse.Action) -> bool:
    return any(g.required and action in g._group_actions for g in p._mutually_exclusive_groups)


def _expected_default(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if action.default else "off"
    if isinstance(action.default, (tuple, list)):
        return ",".join(map(str, action.default))
    return str(action.default)


def test_every_command_and_option_has_help():
    parser = build_parser()
    missing = [f"retr {cmd}: {a.option_strings or a.dest}" for cmd, _, a in _actions(parser)
               if _visible(a) and not (a.help or "").strip()]
    assert not missing, "options without help:\n" + "\n".join(missing)
    undescribed = [name for name, p in surface.parsers(parser) if not (p.description or "").strip()]
    assert not undescribed, f"commands without a description: {undescribed}"


def test_every_help_shows_its_default():
    """An option that takes a value and is not required says its default: the value itself where there is one
    (appended by the formatter unless the help states it), in words where there is none (``None``)."""
    parser = build_parser()
    bad = []
    for cmd, p, a in _actions(parser):
        if not (_visible(a) and a.option_strings) or a.required or _required_in_group(p, a):
            continue
        if a.nargs == 0 and not isinstance(a, argparse.BooleanOptionalAction):
            continue  # a flag: off unless given
        if a.default == [] and isinstance(a, argparse._AppendAction):
            continue  # repeatable: none unless given
        shown = surface.HelpFormatter(p.prog)._expand_help(a)
        if "default" not in shown.lower() or (a.default is not None and _expected_default(a) not in shown):
            bad.append(f"retr {cmd} {a.option_strings[-1]}: {shown!r}")
    assert not bad, "help that does not show the default:\n" + "\n".join(bad)
    for _, p in surface.parsers(parser):
        assert p.formatter_class is surface.HelpFormatter, p.prog


def test_help_shows_the_rerank_depth_and_hides_the_old_names(capsys):
    from retr.retrieval.rerank import DEFAULT_RERANK_DEPTH

    for cmd in ("search", "eval", "serve"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = " ".join(capsys.readouterr().out.split())  # whatever the terminal's width
        assert (f"--rerank-depth N first-stage hits the cross-encoder rescores (default: "
                f"{DEFAULT_RERANK_DEPTH}, chosen on dev by quality per ms)") in out
        assert "--rerank MODEL_DIR" in out
        hidden = _aliases(dict(surface.parsers(build_parser()))[cmd])
        assert hidden and not any(old in out.split() or f"[{old} " in out for old in hidden), out


def test_one_visible_name_per_concept():
    parser = build_parser()
    visible: dict[str, set[str]] = {}
    hidden: dict[str, set[str]] = {}
    for cmd, _, a in _actions(parser):
        for s in a.option_strings:
            (visible if _visible(a) else hidden).setdefault(s, set()).add(cmd)
    problems = []
    for concept, (canonical, names) in CONCEPTS.items():
        assert canonical in names, concept
        for name in sorted(names - {canonical}):
            if name in visible:
                problems.append(f"{concept}: {name} (in {', '.join(sorted(visible[name]))}) is a second name for "
                                f"{canonical}")
            if name in hidden and canonical not in surface.DEPRECATED.get(name, ()):
                problems.append(f"{concept}: hidden {name} is not a deprecated alias of {canonical}")
    assert not problems, "\n".join(problems)
    # the aliases registry agrees with the table, each new name exists, and an old name is hidden wherever one of
    # its new names is there (visible only in a command without them: `--mode` in search, `--rerank` in search)
    for old, new in RENAMED:
        assert any(old in names for _, names in CONCEPTS.values()), old
        assert any(new == canonical for canonical, _ in CONCEPTS.values()), new
        assert new in visible and old in hidden, (old, new)
    for _, p in surface.parsers(parser):
        have = p._option_string_actions
        for old, names in surface.DEPRECATED.items():
            if old in have and any(n in have for n in names):
                assert isinstance(have[old], surface._DeprecatedAlias), (p.prog, old)


def test_an_option_is_spelled_the_same_way_in_every_command():
    """Where two commands store the same setting (one ``dest``), they give it the same visible option strings."""
    spellings: dict[str, dict[tuple[str, ...], list[str]]] = {}
    for cmd, _, a in _actions(build_parser()):
        if _visible(a) and a.option_strings:
            spellings.setdefault(a.dest, {}).setdefault(tuple(a.option_strings), []).append(cmd)
    differing = {dest: s for dest, s in spellings.items() if len(s) > 1}
    assert not differing, differing


@pytest.mark.parametrize("old,new", RENAMED)
def test_each_deprecated_name_warns_once_and_does_what_the_new_one_does(old, new, capsys, monkeypatch):
    monkeypatch.setattr(surface, "_warned", set())
    parser = build_parser()
    commands = [(name, p) for name, p in surface.parsers(parser) if _aliases(p).get(old) == new]
    assert commands, f"no command takes {old}"
    warnings = []
    for name, p in commands:
        argv = [*name.split(), *_required_argv(p)]
        value = SAMPLE[new]
        expected = vars(parser.parse_args([*argv, new, value]))
        assert expected[p._option_string_actions[new].dest] == value
        assert capsys.readouterr().err == ""  # the new name never warns
        for _ in range(2):
            assert vars(parser.parse_args([*argv, old, value])) == expected, (name, old)
            warnings += capsys.readouterr().err.splitlines()
    assert warnings == [f"retr: warning: {old} is deprecated; use {new}"]  # once a process, whatever the command


def _required_argv(p: argparse.ArgumentParser) -> list[str]:
    """The least a command needs to parse: a value for each positional and required option (and one option of each
    required group)."""
    argv = []
    for a in p._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            argv.append("x")
        elif a.required:
            argv += [a.option_strings[0], "x"]
    for g in p._mutually_exclusive_groups:
        if g.required:
            argv += [g._group_actions[0].option_strings[0], "x"]
    return argv


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"retr {metadata.version('retr')}"


def test_version_of_a_source_tree_that_is_not_installed(monkeypatch):
    import tomllib

    from retr.cli.main import version

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version() == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_cli_reference_is_current():
    page = REPO / "docs" / "reference" / "cli.md"
    assert page.is_file() and page.read_text(encoding="utf-8") == render(), (
        f"docs/reference/cli.md is stale: regenerate it with `{REGENERATE}`")


def test_cli_reference_lists_every_command_and_option():
    parser = build_parser()
    text = render(parser)
    for name, p in surface.parsers(parser):
        if name:
            assert f"`{p.prog}`" in text
        for a in p._actions:
            if _visible(a) and a.option_strings:
                assert f"`{', '.join(a.option_strings)}" in text, (name, a.option_strings)
    for old, names in surface.DEPRECATED.items():
        assert f"| `{old}` | {' or '.join(f'`{new}`' for new in names)} |" in text


@pytest.mark.parametrize("command,groups", [
    ("eval", ["model and graphs", "fusion, BM25 and passages", "ANN index", "reranking", "encoding on Ray"]),
    ("index", ["model and graphs", "fusion, BM25 and passages", "ANN index", "reranking", "encoding on Ray"]),
    ("search", ["model and graphs", "fusion, BM25 and passages", "reranking"]),
    ("train bi-encoder", ["training"]),
])
def test_a_command_of_many_options_shows_its_everyday_ones_first_and_groups_the_rest(command, groups, capsys):
    import re

    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    text = capsys.readouterr().out
    usage = text.split("\n\n", 1)[0]
    assert usage.rstrip().endswith("[OPTIONS]") and usage.count("\n") < 8, usage
    titles = re.findall(r"^([a-zA-Z][^\n:]*):$", text, flags=re.M)
    assert titles[-len(groups):] == groups and "options" in titles, titles
    everyday = text.split("\noptions:\n", 1)[1].split(f"\n{groups[0]}:\n", 1)[0]
    assert "--model " not in everyday and "--rerank-depth" not in everyday and "--hnsw-m" not in everyday
    parser = dict(surface.parsers(build_parser()))[command]
    for a in parser._actions:  # every option still shown, once
        if _visible(a) and a.option_strings:
            assert len(re.findall(rf"^  {re.escape(a.option_strings[0])}(?=[ ,\n])", text, flags=re.M)) == 1, \
                a.option_strings
