"""mkdocs hooks (mkdocs.yml ``hooks``): the changelog page is CHANGELOG.md, whose links are written from the
repository's root (where GitHub shows it); on the site the page sits inside ``docs/``, so ``docs/...`` links lose
that prefix there."""

from __future__ import annotations

import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def on_page_markdown(markdown: str, page, **_kwargs) -> str:
    if page.file.src_uri != "changelog.md":
        return markdown
    return re.sub(r"\]\(docs/", "](", CHANGELOG.read_text(encoding="utf-8"))
