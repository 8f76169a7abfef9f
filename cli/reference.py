"""The CLI reference (docs/reference/cli.md), rendered from the parser itself: every command, its usage, and each
option with its help and default as ``--help`` shows them.

    python -m retr.cli.reference > docs/reference/cli.md

tests/test_cli_surface.py fails when the committed page differs from what this renders.
"""

from __future__ import annotations

import argparse
import sys

REGENERATE = "python -m retr.cli.reference > docs/reference/cli.md"
_WIDTH = 100  # of the usage lines, whatever the terminal


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    from retr.cli.surface import HelpFormatter

    return HelpFormatter(parser.prog, width=_WIDTH)


def _usage(parser: argparse.ArgumentParser) -> str:
    f = _formatter(parser)
    f.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return f.format_help().strip()


def _options_table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    f = _formatter(parser)
    required_groups = {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    rows = []
    for action in actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        name = f"`{f._format_action_invocation(action)}`"
        if action.required and action.option_strings:
            name += " (required)"
        elif action in required_groups:
            others = ", ".join(o.option_strings[0] for o in sorted(required_groups, key=parser._actions.index)
                               if o is not action and o.option_strings)
            name += f" (or {others})"
        rows.append(f"| {_cell(name)} | {_cell(f._expand_help(action))} |")
    if not rows:
        return []
    return ["| Option | Description |", "| --- | --- |", *rows]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    return [(a.dest, a.help or "") for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for a in action._choices_actions]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page, Markdown."""
    from retr.cli.main import build_parser
    from retr.cli.surface import DEPRECATED, parsers

    parser = parser or build_parser()
    out = ["# CLI reference", "",
           "Every command and option, with its default. `retr COMMAND --help` prints the same text; a command of "
           "many options shows its everyday ones first and the others in groups.", ""]
    for name, p in parsers(parser):
        depth = 1 + len(name.split()) if name else 1
        if name:
            out += [f"{'#' * min(depth, 4)} `{p.prog}`", ""]
        if p.description:
            out += [p.description, ""]
        out += ["```text", _usage(p), "```", ""]
        subs = _subcommands(p)
        if subs:
            out += ["| Command | What it does |", "| --- | --- |"]
            out += [f"| `{p.prog} {sub}` | {_cell(text)} |" for sub, text in subs]
            out.append("")
        for group in p._action_groups:
            table = _options_table(p, group._group_actions)
            if table and group.title not in ("options", "positional arguments", "optional arguments"):
                out += [f"*{group.title}:*", ""]
            if table:
                out += [*table, ""]
    out += ["## Deprecated option names", "",
            "Older names that still work, hidden from `--help`; each prints one warning a process and does exactly "
            "what the new name does.", "",
            "| Old name | Use |", "| --- | --- |"]
    out += [f"| `{old}` | {' or '.join(f'`{new}`' for new in names)} |" for old, names in DEPRECATED.items()]
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
