"""What one MLM input holds (``--packing``), and the next-sentence labels (``--nsp``).

- ``documents``: each document alone, cut at the max length (one segment; no NSP).
- ``pairs``: two single sentences, ``[CLS] A [SEP] B [SEP]``: every sentence of a document with the one after it
  (BERT's sentence-pair input, RoBERTa's SENTENCE-PAIR).
- ``segments``: contiguous runs of a document's sentences filling the max length, cut at a sentence boundary drawn
  at random into A and B (BERT's own input, RoBERTa's SEGMENT-PAIR); a run of one long sentence is cut between its
  words.

With NSP, exactly half the examples (drawn with the seed) take as B the B of an example from another document
(NotNext, label 1), the rest keep their own continuation (IsNext, label 0): the [CLS] head learns which. Without NSP
every B is the continuation, so the inputs are the contiguous text the packing names.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)
# a sentence ends at . ! or ? before a space: no capital is asked for after it (the lower-cased corpora, ADI's and
# Cranfield's, have none); an abbreviation ends one too, which costs MLM nothing
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

PACKINGS = ("documents", "pairs", "segments")
IS_NEXT, NOT_NEXT = 0, 1  # transformers' next_sentence_label


@dataclass(frozen=True)
class Packed:
    """The training examples of one corpus: ``a`` (and ``b``, ``next_label`` for pairs and segments)."""

    a: list[str]
    b: list[str] | None = None
    next_label: list[int] | None = None

    def rows(self) -> dict[str, list]:
        out: dict[str, list] = {"text": self.a}
        if self.b is not None:
            out["text_b"] = self.b
        if self.next_label is not None:
            out["next_sentence_label"] = self.next_label
        return out

    def summary(self) -> dict:
        """What the manifest records of the examples."""
        n = len(self.a)
        labels = self.next_label or []
        return {"examples": n, "not_next": sum(labels) if self.next_label is not None else None}


def check_packing(packing: str, nsp: bool) -> None:
    if packing not in PACKINGS:
        raise RetrError(f"unknown packing {packing!r}: choose one of {', '.join(PACKINGS)}")
    if nsp and packing == "documents":
        raise RetrError("--nsp needs two segments an input: --packing pairs or segments")


def pack(texts: Sequence[str], packing: str, nsp: bool, count: Callable[[list[str]], list[int]], budget: int,
         seed: int) -> Packed:
    """The examples of ``texts`` (one document each) for ``packing``; ``count`` gives each text's tokens, ``budget``
    the tokens an input holds besides its special tokens."""
    check_packing(packing, nsp)
    if packing == "documents":
        return Packed(list(texts))
    rng = random.Random(seed)
    a: list[str] = []
    b: list[str] = []
    doc: list[int] = []
    skipped = 0
    for i, text in enumerate(texts):
        sents = sentences(text)
        pieces = _pairs(sents) if packing == "pairs" else _segments(sents, count(sents) if sents else [], budget, rng)
        skipped += not pieces
        for first, second in pieces:
            a.append(first)
            b.append(second)
            doc.append(i)
    if skipped:
        logger.info("%d documents give no %s (one sentence or none)", skipped, packing)
    if not a:
        raise RetrError(f"--packing {packing}: no document has two sentences to pair")
    labels = None
    if nsp:
        if len(set(doc)) < 2:
            raise RetrError("--nsp: the pairs come from one document; NotNext needs another document's text")
        labels = [IS_NEXT] * len(a)
        originals = list(b)
        for j in rng.sample(range(len(a)), len(a) // 2):  # exactly half NotNext
            k = rng.randrange(len(a))
            while doc[k] == doc[j]:
                k = rng.randrange(len(a))
            b[j] = originals[k]
            labels[j] = NOT_NEXT
    return Packed(a, b, labels)


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text.strip()) if s.strip()]


def _pairs(sents: list[str]) -> list[tuple[str, str]]:
    return list(zip(sents, sents[1:], strict=False))


def _segments(sents: list[str], sizes: list[int], budget: int, rng: random.Random) -> list[tuple[str, str]]:
    """Runs of consecutive sentences of at most ``budget`` tokens (a longer sentence alone), each cut in two."""
    runs: list[list[str]] = []
    run: list[str] = []
    used = 0
    for sent, size in zip(sents, sizes, strict=True):
        if run and used + size > budget:
            runs.append(run)
            run, used = [], 0
        run.append(sent)
        used += size
    if run:
        runs.append(run)
    out = []
    for run in runs:
        if len(run) == 1:  # one sentence: cut between its words
            words = run[0].split()
            if len(words) < 2:
                continue
            cut = rng.randrange(1, len(words))
            out.append((" ".join(words[:cut]), " ".join(words[cut:])))
        else:
            cut = rng.randrange(1, len(run))
            out.append((" ".join(run[:cut]), " ".join(run[cut:])))
    return out
