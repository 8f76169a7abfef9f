"""How the command line presents itself: every ``--help`` shows each option's default, a command of many options
shows its everyday ones first and the rest in named groups (``GROUPS``), and the names an option had before it was
renamed still work, hidden, with one warning a process.

``finish(parser)`` applies both to a parser and every subcommand under it; `retr.cli.main.build_parser` calls it
once the subcommands have added their options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

# old name -> the names it may stand for, the one registry of renamed options: every (sub)command that has one of
# them (the first it has; unless it is required there: argparse would not count the old name as giving it) also
# accepts the old one, hidden from --help, warning once a process
DEPRECATED: dict[str, tuple[str, ...]] = {
    "--reranker": ("--rerank", "--check-reranker"),  # the cross-encoder folder, as `Index.search(rerank=)`
    "--pipelines": ("--mode", "--modes"),  # what to run: one pipeline (search), a list of them (eval)
    "--mode": ("--modes",),  # eval: the pipelines to measure, a list (`--mode` is one pipeline, in search)
    "--rerank": ("--check-reranker",),  # index: check a cross-encoder (`--rerank` is the +rerank stage's model)
    "--aggregate": ("--passage-aggregate",),  # a document's score from its passages', at build and at query time
    "--output": ("--out",),  # the file or folder a command writes (Pyserini's name for a run file)
}

# the one registry of option groups: a command of more than ``GROUP_FROM`` options shows its everyday options first
# (in its usage line and under "options"), then each group holding any of its options, in this order; a group
# named with command prefixes it is not used for (a trainer's batch size and max length are everyday options there)
GROUP_FROM = 12
GROUPS: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    ("model and graphs", frozenset({"--model", "--max-length", "--batch-size", "--backend", "--query-backend",
                                    "--query-prompt", "--doc-prompt"}), ("train",)),
    ("fusion, BM25 and passages", frozenset({"--fusion", "--fusion-depth", "--passage-aggregate", "--passages",
                                             "--bm25-k1", "--bm25-b", "--bm25-method", "--bm25-delta",
                                             "--bm25-language"}), ()),
    ("ANN index", frozenset({"--kind", "--hnsw-m", "--ef-construction", "--ef-search", "--nlist", "--pq-m",
                             "--pq-nbits", "--nprobe", "--lean-m", "--lean-nprobe", "--k-factor", "--shards"}), ()),
    ("reranking", frozenset({"--rerank", "--check-reranker", "--rerank-depth", "--rerank-max-length", "--rerank-inputs",
                             "--rerank-backend", "--rerank-alpha", "--no-rerank-check"}), ()),
    ("encoding on Ray", frozenset({"--executor", "--ray-address", "--ray-actors", "--ray-cpus-per-actor"}), ()),
    ("training", frozenset({"--mini-batch-size", "--num-negatives", "--negatives", "--dev-fraction", "--teacher",
                            "--teacher-weight", "--precision", "--freeze-layers", "--max-steps", "--resume", "--attention-dropout",
                            "--hidden-dropout", "--whole-word", "--mask-prob", "--in-batch-negatives", "--distill",
                            "--inputs", "--layers", "--no-graphs", "--seed", "--lr"}), ()),
)
GROUPED = "retr_group"  # the attribute an option moved into a group carries (its title)

_warned: set[str] = set()


def warn_deprecated(old: str, new: str) -> None:
    """Print ``old is deprecated; use new`` on stderr, once a process for each old name."""
    if old not in _warned:
        _warned.add(old)
        print(f"retr: warning: {old} is deprecated; use {new}", file=sys.stderr)


class _DeprecatedAlias(argparse.Action):
    """An old option name: warns, then does exactly what the canonical option does (same dest, type, choices)."""

    def __init__(self, option_strings, dest, canonical: argparse.Action, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.canonical = canonical

    def __call__(self, parser, namespace, values, option_string=None):
        new = self.canonical.option_strings[-1]
        warn_deprecated(option_string or self.option_strings[0], new)
        self.canonical(parser, namespace, values, new)


def _add_aliases(parser: argparse.ArgumentParser) -> None:
    have = parser._option_string_actions
    for old, names in DEPRECATED.items():
        action = next((have[new] for new in names if new in have and not isinstance(have[new], _DeprecatedAlias)),
                      None)
        if action is None or action.required or old in have:
            continue
        parser.add_argument(old, action=_DeprecatedAlias, canonical=action, dest=action.dest, nargs=action.nargs,
                            type=action.type, choices=action.choices, metavar=action.metavar,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def default_text(action: argparse.Action) -> str | None:
    """The default to show after an option's help, or None where there is none to show: a flag (off unless given),
    a required option, a positional, an option without a value by default (its help says what happens then), or
    help that already states its default."""
    if not action.option_strings or action.required or action.help is argparse.SUPPRESS:
        return None
    default = action.default
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if default else "off"
    if action.nargs == 0 or default is None or default is argparse.SUPPRESS or default == []:
        return None
    if isinstance(default, (tuple, list)):
        shown = ",".join(str(v) for v in default)
    else:
        shown = "''" if default == "" else str(default)
    text = _own_help(action).lower()
    if "default:" in text or f"default {shown}".lower() in text:  # the help says it already, perhaps with why
        return None
    return shown


def _own_help(action: argparse.Action) -> str:
    """The help as written (Python 3.9 to 3.12 append their own "(default: ...)" to a BooleanOptionalAction's)."""
    text = action.help or ""
    return text.removesuffix(" (default: %(default)s)")


def help_template(action: argparse.Action) -> str:
    """An option's help with its default, as ``--help`` and the CLI reference show it (argparse's ``%(...)s``
    fields not yet expanded)."""
    text = _own_help(action)
    shown = default_text(action)
    return f"{text} (default: {shown.replace('%', '%%')})" if shown is not None else text


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, each option's default shown after its help."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 30, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width)

    def _get_help_string(self, action: argparse.Action) -> str:
        return help_template(action)

    def _format_usage(self, usage, actions, groups, prefix):
        """The usage line of the everyday options; ``[OPTIONS]`` stands for the grouped ones."""
        everyday = [a for a in actions if not getattr(a, GROUPED, None)]
        text = super()._format_usage(usage, everyday, groups, prefix)
        if usage is None and len(everyday) < len(actions):
            text = text.rstrip("\n") + " [OPTIONS]\n\n"
        return text


def _group_of(command: str, option: str) -> str | None:
    for title, options, not_for in GROUPS:
        if option in options and not any(command == c or command.startswith(c + " ") for c in not_for):
            return title
    return None


def _group(command: str, parser: argparse.ArgumentParser) -> None:
    """Move the options of a command of many into their groups (``GROUPS``), after its everyday ones."""
    own = parser._optionals
    shown = [a for a in own._group_actions if a.option_strings and a.help is not argparse.SUPPRESS]
    if len(shown) <= GROUP_FROM:
        return
    moved: dict[str, list[argparse.Action]] = {}
    for action in shown:
        title = _group_of(command, action.option_strings[-1])
        if title is not None:
            moved.setdefault(title, []).append(action)
    for title, _, _ in GROUPS:
        if title not in moved:
            continue
        group = parser.add_argument_group(title)
        for action in moved[title]:
            own._group_actions.remove(action)
            group._group_actions.append(action)
            setattr(action, GROUPED, title)


def parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command, parser)`` for the parser and each subcommand under it, depth first: ``("", retr)``,
    ``("index", ...)``, ..., ``("train bi-encoder", ...)``."""
    stack = [("", parser)]
    while stack:
        name, p = stack.pop(0)
        yield name, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for sub, sp in action.choices.items():
                    if sp.description is None:
                        sp.description = helps.get(sub)
                stack[:0] = [(f"{name} {sub}".strip(), sp) for sub, sp in action.choices.items()]


def _counts() -> tuple:
    from retr.cli.options import nonnegative_int, positive_int

    return int, positive_int, nonnegative_int


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every (sub)command shows its defaults, describes itself and accepts the deprecated option names; an integer
    option without a metavar of its own shows ``N`` (``--rerank-depth N``, not ``--rerank-depth RERANK_DEPTH``)."""
    counts = _counts()
    for command, p in parsers(parser):
        p.formatter_class = HelpFormatter
        _group(command, p)
        for action in p._actions:
            if action.option_strings and action.metavar is None and action.nargs is None and action.type in counts:
                action.metavar = "N"
        _add_aliases(p)
    return parser
