"""A model's tokenisation at one max length: the token ids its graphs are fed (from its ``tokenizer.json``, else
from the torch tokenizer, loaded only then) and the untruncated counts and offsets that measure and split texts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from retr.retrieval.backends.batching import TOKENIZE_CHUNK, fast_tokenizer, plain_tokenizer


def prefixed(prompt: str, texts: list[str]) -> list[str]:
    """``texts`` with ``prompt`` put before each (empty: as they are)."""
    return [prompt + t for t in texts] if prompt else texts


class Tokens:
    """Tokenises for one model folder at ``max_length``. ``torch_tokenizer`` returns the torch model's tokenizer,
    called only where the folder has no ``tokenizer.json`` (then the model is loaded); ``document_prompt`` is put
    before documents whose truncation is measured (``truncation``), as the encoder puts it before them."""

    def __init__(self, path: Path, max_length: int, torch_tokenizer: Callable[[], object], document_prompt: str = ""):
        self.path = path
        self.max_length = max_length
        self.document_prompt = document_prompt
        self._torch_tokenizer = torch_tokenizer
        self._fast = fast_tokenizer(path, max_length) if max_length else None

    @property
    def fast(self) -> bool:
        """Whether ids come from the folder's ``tokenizer.json`` (no torch model needed to tokenise)."""
        return self._fast is not None

    def ids(self, texts: list[str]) -> list:
        """Each text's token ids, truncated at ``max_length``, special tokens included."""
        if self._fast is not None:
            return self._fast(texts)
        return self._torch_tokenizer()(texts, truncation=True, max_length=self.max_length, padding=False,
                                       return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def counted(self, texts: list[str]) -> tuple[list, np.ndarray | None]:
        """``ids(texts)`` and, where one tokenisation gives both (a ``tokenizer.json``), each text's untruncated
        length (``batching.FastIds.counted``); else the ids and None."""
        if self._fast is not None:
            return self._fast.counted(texts)
        return self.ids(texts), None

    # -- untruncated --------------------------------------------------------------------------------------------
    @functools.cached_property
    def _plain(self):
        return plain_tokenizer(self.path)

    def _encodings(self, texts: list[str], special: bool):
        """The tokenizer.json's untruncated encodings of ``texts``, in chunks."""
        for i in range(0, len(texts), TOKENIZE_CHUNK):
            yield from self._plain.encode_batch(texts[i:i + TOKENIZE_CHUNK], add_special_tokens=special)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as character ``(start, end)`` offsets, untruncated, no special tokens."""
        if self._plain is not None:
            return [e.offsets for e in self._encodings(texts, special=False)]
        enc = self._torch_tokenizer()(texts, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
        return [list(map(tuple, o)) for o in enc["offset_mapping"]]

    def token_counts(self, texts: list[str], special: bool = True) -> np.ndarray:
        """Untruncated token counts (with special tokens where ``special``)."""
        if self._plain is not None:
            return np.fromiter((len(e.ids) for e in self._encodings(texts, special)), dtype=np.int64, count=len(texts))
        ids = self._torch_tokenizer()(texts, add_special_tokens=special, truncation=False)["input_ids"]
        return np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))

    def truncation(self, texts: list[str]) -> dict:
        """How much of ``texts`` (documents or passages, before the document prompt) the encoder never sees: the
        texts longer than its max length and the share of all tokens cut off."""
        return self.truncation_of(self.token_counts(prefixed(self.document_prompt, texts)))

    def truncation_of(self, counts: np.ndarray) -> dict:
        """``truncation`` of texts of these untruncated token counts (special tokens and prompt included)."""
        over = counts > self.max_length
        dropped = int((counts[over] - self.max_length).sum())
        tokens = int(counts.sum())
        return {"max_length": self.max_length, "texts": len(counts), "truncated": int(over.sum()),
                "share_truncated": float(over.mean()) if len(counts) else 0.0, "tokens": tokens,
                "tokens_dropped": dropped, "share_tokens_dropped": dropped / tokens if tokens else 0.0,
                "longest": int(counts.max()) if len(counts) else 0}
