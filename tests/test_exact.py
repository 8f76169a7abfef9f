"""Blockwise exact search (running top-k over a memory-mapped file) against FAISS flat, and reading a memory-mapped
file in blocks without keeping it resident."""

from __future__ import annotations

import numpy as np
import pytest

from retr.indexes.dense import exact_topk, row_blocks


def _unit(rng, n, d=32):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("block_rows", [1, 7, 1000, 100_000])
def test_exact_topk_equals_faiss_flat_over_a_memory_mapped_file(tmp_path, block_rows):
    import faiss

    rng = np.random.default_rng(0)
    x, q = _unit(rng, 3001), _unit(rng, 13)
    np.save(tmp_path / "v.npy", x)
    vectors = np.load(tmp_path / "v.npy", mmap_mode="r")
    flat = faiss.IndexFlatIP(32)
    flat.add(x)
    want_s, want_p = flat.search(q, 25)
    got_s, got_p = exact_topk(vectors, q, 25, block_rows=block_rows)
    np.testing.assert_array_equal(got_p, want_p)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-6)


def test_exact_topk_breaks_ties_by_position_across_blocks():
    rng = np.random.default_rng(1)
    x = _unit(rng, 50)
    x[[3, 17, 41]] = x[9]  # four identical vectors, in different blocks
    q = x[9:10] + 0.01 * _unit(rng, 1)
    _, p = exact_topk(x, q, 3, block_rows=10)
    assert p[0].tolist() == [3, 9, 17]
    s, p = exact_topk(x, q, 100)  # k larger than the collection: every row, once
    assert sorted(p[0].tolist()) == list(range(50)) and np.all(np.diff(s[0]) <= 0)


def test_row_blocks_yields_every_row_and_drops_pages_of_read_only_maps(tmp_path):
    rng = np.random.default_rng(2)
    x = _unit(rng, 20_000, 64)
    np.save(tmp_path / "v.npy", x)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    np.testing.assert_array_equal(np.concatenate(list(row_blocks(mapped, 3000))), x)
    writable = np.load(tmp_path / "v.npy", mmap_mode="c")  # private: dropping its pages would lose the write
    blocks = row_blocks(writable, 3000)
    writable[5000] = 0.0  # an unflushed write to a writable map survives reading it in blocks
    assert np.concatenate(list(blocks))[5000].sum() == 0.0


def test_training_sample_is_gathered_block_by_block_as_the_seeded_rows(tmp_path):
    from retr.indexes.dense import BLOCK_ROWS, DenseIndexConfig, _train_sample

    rng = np.random.default_rng(3)
    n = 2 * BLOCK_ROWS + 123
    x = rng.normal(size=(n, 4)).astype(np.float32)
    np.save(tmp_path / "v.npy", x)
    cfg = DenseIndexConfig(train_sample=50_000, seed=7)
    got = _train_sample(np.load(tmp_path / "v.npy", mmap_mode="r"), cfg, nlist=1)
    rows = np.sort(np.random.default_rng(7).choice(n, 50_000, replace=False))
    np.testing.assert_array_equal(got, x[rows])
