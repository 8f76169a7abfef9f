"""Progress of long steps where stderr is not a terminal: a line at a steady interval with the count, the rate and
the time left; no third-party bar ever reaches the log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from retr.retrieval.errors import RetrError
from retr.retrieval.progress import INTERVAL_ENV, Progress

_WORDS = "solar wind grid battery storage turbine panel voltage current heat pump roof cell charge".split()
_LINE = re.compile(r"\[retr\] INFO encoding: ([\d,]+)/600 docs \(\d+%\), [\d,.]+ docs/s, \d+:\d\d spent, ETA \d+:\d\d")


def test_index_piped_to_a_file_logs_progress_lines_with_count_and_rate(tiny_bi_encoder, tmp_path):
    corpus = tmp_path / "c.jsonl"
    with corpus.open("w") as fh:  # 600 documents of ~30 words: many encoding batches under the token budget
        for i in range(600):
            text = " ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(30))
            fh.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    log = tmp_path / "log"
    env = {**os.environ, INTERVAL_ENV: "0"}
    with log.open("w") as err:  # stderr a file, as with `2> log`
        done = subprocess.run([sys.executable, "-m", "retr.cli.main", "index", "--corpus", str(corpus), "--out",
                               str(tmp_path / "x.idx"), "--model", str(tiny_bi_encoder)], stderr=err,
                              stdout=subprocess.PIPE, text=True, timeout=300, env=env)
    text = log.read_text()
    assert done.returncode == 0, text
    counts = [int(m.group(1).replace(",", "")) for m in _LINE.finditer(text)]
    assert len(counts) >= 2, text
    assert counts == sorted(counts) and counts[0] < 600, text
    assert re.search(r"encoding: 600/600 docs \(100%\), [\d,.]+ docs/s, done in \d+:\d\d", text), text
    assert "\r" not in text and "it/s" not in text  # no bar drawn into a file


def test_no_progress_lines_at_the_default_interval_for_a_short_step(monkeypatch, caplog):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    with caplog.at_level("INFO", logger="retr"), Progress(50, "encoding", bar=False) as bar:
        for _ in range(50):
            bar.update(1)
    assert not [r for r in caplog.records if "encoding:" in r.getMessage()]


def test_a_bad_interval_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(RetrError, match=f"{INTERVAL_ENV} must be a number of seconds >= 0, got 'soon'"):
        Progress(10, "encoding")


def test_bm25_over_many_documents_draws_no_third_party_bar(tmp_path, capfd):
    from retr.indexes.bm25 import build_bm25
    from retr.retrieval.bm25 import BM25Config

    texts = [f"{_WORDS[i % len(_WORDS)]} {_WORDS[(i * 3) % len(_WORDS)]} number{i}" for i in range(10_001)]
    build_bm25(texts, tmp_path / "bm25", BM25Config())
    out, err = capfd.readouterr()
    for bar in ("Split strings", "BM25S", "Count Tokens", "Stem Tokens", "it/s"):
        assert bar not in out + err, (bar, err[-500:])
