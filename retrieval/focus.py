"""What a cross-encoder reads of a document: its head, or the sentences that share most terms with the query.

A cross-encoder reads ``max_length`` tokens of (query, document). Cut at the head, a document longer than that
loses whatever comes after its first sentences, which is often where the evidence a query asks for sits, so a
model has to be trained and run at 256 tokens or more to see it. ``focused`` keeps, within the same budget, the
document's first segment (its title and first sentence) and then its sentences by how many of the query's terms
(BM25's: stemmed, stopwords out) each holds, in the document's own order: half the tokens hold what the head
needed all of them for (README, "Reranking within a budget"). A document that fits is read whole either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from retr.retrieval.errors import RetrError

# a sentence ends at . ! or ? followed by space and what starts a sentence
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[\"'])")
PAIR_SPECIAL_TOKENS = 3  # [CLS] query [SEP] document [SEP]

INPUT_FORMS = {  # how a cross-encoder's document input is made; recorded with the model at training
    "head": "the document's first tokens (cut at max_length)",
    "focused": "the document's first sentence, then its sentences sharing most query terms, in order, within "
               "max_length",
}
DEFAULT_INPUTS = "head"  # a cross-encoder that records none (trained before the forms, or not by retr)


def check_inputs(name: str) -> str:
    if name not in INPUT_FORMS:
        raise RetrError(f"unknown cross-encoder input form {name!r}: choose one of {', '.join(INPUT_FORMS)}")
    return name


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text.strip()) if s]


@dataclass(frozen=True)
class Focus:
    """Makes focused documents for one cross-encoder: ``count`` gives each text's tokens (no special tokens) in
    its tokenizer; ``terms`` a text's matching terms."""

    count: Callable[[list[str]], list[int]]
    terms: Callable[[str], list[str]]
    max_length: int

    def texts(self, query: str, texts: list[str]) -> list[str]:
        """``texts`` as the cross-encoder reads them after ``query``."""
        budget = self.max_length - PAIR_SPECIAL_TOKENS - self.count([query])[0]
        wanted = set(self.terms(query))
        return [self._one(t, budget, wanted) for t in texts]

    def _one(self, text: str, budget: int, wanted: set[str]) -> str:
        parts = sentences(text)
        if len(parts) <= 1:
            return text
        sizes = self.count(parts)
        if sum(sizes) <= budget:
            return text
        hits = [len(wanted.intersection(self.terms(p))) for p in parts]
        keep = [0]
        used = sizes[0]
        for i in sorted(range(1, len(parts)), key=lambda i: (-hits[i], i)):
            if used + sizes[i] <= budget:
                keep.append(i)
                used += sizes[i]
        return " ".join(parts[i] for i in sorted(keep))


def make_focus(tokenizer, max_length: int) -> Focus:
    """A ``Focus`` counting tokens with ``tokenizer`` (a ``tokenizers.Tokenizer`` without truncation, or a
    transformers tokenizer) and matching terms as BM25 does."""
    from retr.retrieval.bm25 import analyzer

    if hasattr(tokenizer, "encode_batch"):
        def count(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    else:
        def count(texts: list[str]) -> list[int]:
            return [len(x) for x in tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]]
    return Focus(count, analyzer(), max_length)
