"""TREC run files (``qid Q0 docid rank score tag``): the edge where a ``Run`` meets trec_eval and other tools."""

from __future__ import annotations

from pathlib import Path

from retr.indexes.corpus import lines
from retr.retrieval.artifacts import atomic_write_text
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Hit, Run


def write_trec(run: Run, path: str | Path, tag: str = "retr") -> None:
    """Write ``run`` as a TREC run file, atomically; scores as Python writes them back exactly (repr)."""
    out = []
    for qid, hits in run.items():
        for rank, h in enumerate(hits, start=1):
            out.append(f"{qid} Q0 {h.doc_id} {rank} {h.score!r} {tag}\n")
    atomic_write_text(Path(path), "".join(out))


def read_trec(path: str | Path) -> Run:
    path = Path(path)
    rankings: dict[str, list[Hit]] = {}
    for lineno, line in lines(path):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) < 6:
            raise RetrError(f"{path}:{lineno}: a TREC run line needs 6 fields, got {len(parts)}")
        try:
            score = float(parts[4])
        except ValueError:
            raise RetrError(f"{path}:{lineno}: score {parts[4]!r} is not a number") from None
        rankings.setdefault(parts[0], []).append(Hit(parts[2], score))
    return Run(rankings)
