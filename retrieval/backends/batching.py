"""Tokenise with a model's ``tokenizer.json`` (no transformers import) and pack texts into padded batches."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

TOKENIZE_CHUNK = 512  # texts per tokenizer call


def in_chunks(work: Callable[[list], list], texts: list, least: int = TOKENIZE_CHUNK) -> list:
    """``work`` over ``texts`` in chunks of at most ``TOKENIZE_CHUNK``, its results joined in order: on one thread
    per core (``platform.thread_count``) where there are several chunks, and ``texts`` cut into one chunk a thread
    where each would still hold ``least`` texts. The tokenizers library lets go of Python's lock while it
    tokenises, so threads run side by side: 1,000 SciFact documents in 0.52 s on two threads against 0.98 s on
    one (2-core Xeon). Its own parallelism stays off (``TOKENIZERS_PARALLELISM``: it warns in every process
    forked after it)."""
    from retr.retrieval.backends.platform import thread_count

    if len(texts) < 2 * least and len(texts) <= TOKENIZE_CHUNK:  # one chunk (a query): no threads to count
        return work(texts)
    threads = thread_count()
    size = TOKENIZE_CHUNK
    if threads > 1 and len(texts) >= 2 * least:
        size = min(size, max(least, -(-len(texts) // threads)))
    chunks = [texts[i: i + size] for i in range(0, len(texts), size)]
    threads = min(len(chunks), threads)
    if threads <= 1:
        parts = [work(c) for c in chunks]
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="retr-tokenize") as pool:
            parts = list(pool.map(work, chunks))
    return [x for part in parts for x in part]


# texts a thread takes at least where a short list (a query's pairs, a few documents' sentences) is tokenised on
# several: below this, starting a thread costs about what it saves
LEAST_PER_THREAD = 8


def _fast_tokenizer_file(model_path: Path | None, max_length: int):
    if model_path is None:
        return None
    candidates = [model_path / "tokenizer.json", *sorted(model_path.glob("*/tokenizer.json"))]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length, strategy="longest_first")
    tok.no_padding()
    return tok


def plain_tokenizer(model_path: Path | None):
    """The model's tokenizer.json with neither truncation nor padding (to count and place tokens), or None."""
    tok = _fast_tokenizer_file(model_path, 1)
    if tok is not None:
        tok.no_truncation()
    return tok


class FastIds:
    """``texts -> token ids`` from a model's tokenizer.json, truncated at its max length, in chunks, kept as arrays:
    a batch's Encoding objects (offsets, masks, truncated overflow) cost ~60x the ids' memory (measured: +330 MB
    for SciFact's 5,183 documents encoded in one call)."""

    def __init__(self, tok):
        self._encode = ids_only(tok)
        post = tok.post_processor
        self._specials = post.num_special_tokens_to_add(False) if post is not None else 0

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        return in_chunks(lambda chunk: [np.asarray(e.ids, dtype=np.int64) for e in self._encode(chunk)], texts)

    def counted(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
        """The ids and each text's untruncated length (special tokens included), from one tokenisation: what
        truncation cut off comes back as overflowing pieces (stride 0: no token twice), each with its own
        special tokens (the same lengths as an untruncated tokenisation, and ~0.3 s less than a second pass over
        1,000 SciFact documents)."""
        def chunk_ids(chunk: list[str]) -> list[tuple[np.ndarray, int]]:
            return [(np.asarray(e.ids, dtype=np.int64),
                     len(e.ids) + sum(len(o.ids) - self._specials for o in e.overflowing)) for e in self._encode(chunk)]

        pairs = in_chunks(chunk_ids, texts)
        return [ids for ids, _ in pairs], np.fromiter((n for _, n in pairs), dtype=np.int64, count=len(pairs))


def fast_tokenizer(model_path: Path | None, max_length: int) -> FastIds | None:
    """The model's truncating ``texts -> token ids`` (``FastIds``), or None without a tokenizer.json."""
    tok = _fast_tokenizer_file(model_path, max_length)
    return FastIds(tok) if tok is not None else None


def ids_only(tok):
    """``tok``'s batch encoding without character offsets where the tokenizers library has it (the same ids and
    type ids, measured identical on SciFact's documents and pairs, in 75-85% of the time), else the full one."""
    return getattr(tok, "encode_batch_fast", tok.encode_batch)


def fast_pair_tokenizer(model_path: Path | None, max_length: int):
    """A ``(query, texts) -> (token ids, token type ids)`` function for cross-encoder pairs, or None."""
    tok = _fast_tokenizer_file(model_path, max_length)
    if tok is None:
        return None

    encode = ids_only(tok)

    def pair_ids(query: str, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        encs = in_chunks(encode, [(query, t) for t in texts], LEAST_PER_THREAD)
        return [e.ids for e in encs], [e.type_ids for e in encs]

    return pair_ids


# batch widths are rounded up to a multiple of this (never past the longest text): an OpenVINO graph keeps memory
# per input shape it has run, so fewer distinct shapes hold less (measured, SciFact's 5,183 documents through the
# int8 graph: +520 MB after encoding instead of +850, and 76.6 docs/s against 72-75)
WIDTH_STEP = 16


def _greedy_sizes(widths: np.ndarray, cap: int) -> list[int]:
    """Batch sizes over ``widths`` (descending): each batch as many texts as fit ``cap`` padded tokens at its
    first (widest) text's width, at least one."""
    sizes, start = [], 0
    while start < len(widths):
        size = max(1, min(cap // max(int(widths[start]), 1), len(widths) - start))
        sizes.append(size)
        start += size
    return sizes


def _balanced_sizes(widths: np.ndarray, token_budget: int, parts: int) -> list[int]:
    """Batch sizes that run on ``parts`` streams at once with the least padded tokens in the largest batch: as many
    batches as ``token_budget`` needs, rounded up to a multiple of ``parts``, and the smallest per-batch cap that
    packs ``widths`` (descending) into that many (greedy packing under a cap is optimal for contiguous batches of
    descending widths). A query's 20 cross-encoder pairs on 2 streams: two batches of 10, not 9 + 9 + 2 (the two
    left over waiting for a stream)."""
    budget = max(token_budget, int(widths[0]))
    wanted = -(-len(_greedy_sizes(widths, budget)) // parts) * parts
    lo, hi = int(widths[0]), budget
    while lo < hi:  # the smallest cap that needs at most ``wanted`` batches
        mid = (lo + hi) // 2
        if len(_greedy_sizes(widths, mid)) <= wanted:
            hi = mid
        else:
            lo = mid + 1
    return _greedy_sizes(widths, lo)


def length_batches(lengths: np.ndarray, token_budget: int, parts: int = 1):
    """Yield ``(indices, width, attention mask)``: longest first, each batch padded to its own longest text rounded
    up to ``WIDTH_STEP``; as many texts per batch as fit ``token_budget`` padded tokens, or with ``parts`` > 1 (a
    runner's parallel streams) in batches balanced to run ``parts`` at a time (``_balanced_sizes``)."""
    order = np.argsort(-lengths, kind="stable")
    if not len(order):
        return
    longest = int(lengths.max())
    # the longest in each batch (sorted descending), rounded up: at most WIDTH_STEP - 1 padded tokens per text
    widths = np.minimum(-(-lengths[order] // WIDTH_STEP) * WIDTH_STEP, longest)
    sizes = _balanced_sizes(widths, token_budget, parts) if parts > 1 \
        else _greedy_sizes(widths, max(token_budget, longest))
    start = 0
    for size in sizes:
        idx = order[start:start + size]
        width = int(widths[start])
        yield idx, width, attention_mask(lengths[idx], width)
        start += size


def hash_rows(h, rows, tag: bytes = b"") -> None:
    """Feed token-id rows into the hash ``h``, each as ``tag`` + its int64 bytes + ``|`` (their order too)."""
    for r in rows:
        h.update(tag + np.asarray(r, dtype=np.int64).tobytes() + b"|")


def row_key(row) -> str:
    """A digest of one text's token ids: what names a graph's vector of it (``Graph.known``)."""
    import hashlib

    h = hashlib.sha1()
    hash_rows(h, [row])
    return h.hexdigest()


def attention_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """(len(lengths), width) int64: 1 over each row's tokens, 0 over its padding."""
    return (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)


def lone_feed(row, multiple: int = 1, max_length: int | None = None) -> dict[str, np.ndarray]:
    """One text's feed (a query alone): its ids right-padded to the next multiple of ``multiple`` tokens (never
    past ``max_length``, never cut), the mask zero over the padding."""
    n = len(row)
    width = max(n, min(-(-n // multiple) * multiple, max_length or n))
    ids = np.zeros((1, width), dtype=np.int64)
    ids[0, :n] = row
    return {"input_ids": ids, "attention_mask": attention_mask(np.array([n]), width)}


def padded(rows: list, idx: np.ndarray, width: int, lengths: np.ndarray, fill: int = 0) -> np.ndarray:
    """The rows ``idx`` of ``rows`` as one (len(idx), width) int64 array, right-padded with ``fill``."""
    out = np.full((len(idx), width), fill, dtype=np.int64)
    for r, i in enumerate(idx):
        out[r, : int(lengths[i])] = rows[i]
    return out


def run_sorted(runner, rows: list, token_budget: int, out: np.ndarray, extra_rows: dict | None = None,
               on_done=None, parts: int = 1) -> np.ndarray:
    """Run ``runner`` over ``rows`` (token ids) in length-sorted batches; write each output row into ``out``.
    ``extra_rows``: other per-token inputs padded like the ids (a cross-encoder's ``token_type_ids``); ``parts``:
    balance the batches over that many parallel streams (``length_batches``)."""
    lengths = np.fromiter((len(t) for t in rows), dtype=np.int64, count=len(rows))

    def feeds():
        for idx, width, mask in length_batches(lengths, token_budget, parts):
            feed = {"input_ids": padded(rows, idx, width, lengths), "attention_mask": mask}
            for name, extra in (extra_rows or {}).items():
                feed[name] = padded(extra, idx, width, lengths)
            yield idx, feed

    for idx, result in runner.run_batches(feeds(), on_done=on_done):
        out[idx] = result.reshape(out[idx].shape)
    return out
