"""What a cross-encoder reads of a document: its head, or the sentences that share most terms with the query.

A cross-encoder reads ``max_length`` tokens of (query, document). Cut at the head, a document longer than that
loses whatever comes after its first sentences, which is often where the evidence a query asks for sits, so a
model has to be trained and run at 256 tokens or more to see it. ``focused`` keeps, within the same budget, the
document's first segment (its title and first sentence) and then its sentences by how many of the query's terms
(BM25's: stemmed, stopwords out) each holds, in the document's own order: half the tokens hold what the head
needed all of them for (README, "What the cross-encoder reads"). A document that fits is read whole either way.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
class Sentences:
    """A document cut into sentences, each's size in the cross-encoder's tokens and its matching terms."""

    parts: list[str]
    sizes: list[int]
    terms: list[frozenset[str]]


SEEN_DOCUMENTS = 20_000  # documents whose sentences a Focus keeps (a reranked head's documents recur over queries)


@dataclass(frozen=True)
class Focus:
    """Makes focused documents for one cross-encoder: ``count`` gives each text's tokens (no special tokens) in
    its tokenizer; ``terms`` a text's matching terms."""

    count: Callable[[list[str]], list[int]]
    terms: Callable[[str], list[str]]
    max_length: int
    _seen: dict[str, Sentences] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def texts(self, query: str, texts: list[str]) -> list[str]:
        """``texts`` as the cross-encoder reads them after ``query``."""
        cut = self._sentences(texts)
        budget = self.max_length - PAIR_SPECIAL_TOKENS - self.count([query])[0]
        wanted = set(self.terms(query))
        return [text if doc is None else self._one(text, doc, budget, wanted) for text, doc in zip(texts, cut,
                                                                                                   strict=True)]

    def _sentences(self, texts: list[str]) -> list[Sentences | None]:
        """Each text's sentences (None: one sentence, read whole), from those seen before or measured now (one
        tokenizer call for all: a call costs ~0.5 ms however short its texts)."""
        with self._lock:
            found = {t: self._seen.get(t) for t in texts}
        new = list(dict.fromkeys(t for t, doc in found.items() if doc is None))
        split = [sentences(t) for t in new]
        flat = [p for parts in split if len(parts) > 1 for p in parts]
        sizes = self.count(flat) if flat else []
        at = 0
        made = {}
        for text, parts in zip(new, split, strict=True):
            if len(parts) > 1:
                made[text] = Sentences(parts, sizes[at: at + len(parts)], [frozenset(self.terms(p)) for p in parts])
                at += len(parts)
        with self._lock:
            for text, doc in made.items():
                if len(self._seen) >= SEEN_DOCUMENTS:
                    self._seen.pop(next(iter(self._seen)))  # the oldest
                self._seen[text] = doc
        found.update(made)
        return [found.get(t) for t in texts]

    @staticmethod
    def _one(text: str, doc: Sentences, budget: int, wanted: set[str]) -> str:
        if sum(doc.sizes) <= budget:
            return text
        hits = [len(wanted.intersection(t)) for t in doc.terms]
        keep = [0]
        used = doc.sizes[0]
        for i in sorted(range(1, len(doc.parts)), key=lambda i: (-hits[i], i)):
            if used + doc.sizes[i] <= budget:
                keep.append(i)
                used += doc.sizes[i]
        return " ".join(doc.parts[i] for i in sorted(keep))


def make_focus(tokenizer, max_length: int) -> Focus:
    """A ``Focus`` counting tokens with ``tokenizer`` (a ``tokenizers.Tokenizer`` without truncation, or a
    transformers tokenizer) and matching terms as BM25 does."""
    from retr.retrieval.bm25 import analyzer

    if hasattr(tokenizer, "encode_batch"):
        from retr.retrieval.backends.batching import LEAST_PER_THREAD, ids_only, in_chunks

        encode = ids_only(tokenizer)

        def count(texts: list[str]) -> list[int]:  # a query's new documents' sentences: ~100, ~11 ms on one thread
            return in_chunks(lambda part: [len(e.ids) for e in encode(part, add_special_tokens=False)], texts,
                             LEAST_PER_THREAD)
    else:
        def count(texts: list[str]) -> list[int]:
            return [len(x) for x in tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]]
    return Focus(count, analyzer(), max_length)


def _whole(query: str, texts: list[str]) -> list[str]:
    return texts


def reader(inputs: str, model_path: Path, max_length: int) -> Callable[[str, list[str]], list[str]]:
    """``(query, texts) -> texts`` as a cross-encoder in ``model_path`` reading ``inputs`` at ``max_length``
    tokens reads them: what training, reranking and a teacher's scoring all feed it."""
    if check_inputs(inputs) == "head":
        return _whole
    from retr.retrieval.backends.batching import plain_tokenizer

    tokenizer = plain_tokenizer(model_path)
    if tokenizer is None:  # no tokenizer.json: the model's own (slow) tokenizer counts
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return make_focus(tokenizer, max_length).texts
