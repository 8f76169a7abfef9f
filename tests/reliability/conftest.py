"""The fault-injection suite's tally: what was tried and how it ended, printed at the end of the run (the
README's Reliability figures come from this line)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

TALLY: Counter[str] = Counter()


@pytest.fixture
def tally() -> Counter[str]:
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY:
        return
    line = (f"reliability: {TALLY['kills']} kill -9 of `retr index` survived ({TALLY['kills_mid_write']} of them "
            f"mid-write; previous index intact and identical, no leftovers after the next build), {TALLY['corruptions']} corruptions of index and cache files "
            f"({TALLY['clean_errors']} clean errors, {TALLY['rebuilt']} transparent rebuilds, "
            f"{TALLY['unchanged']} harmless), {TALLY['bad_inputs']} bad inputs tried, "
            f"{TALLY['concurrent']} concurrent builds refused, {TALLY['reader_opens']} reader opens during "
            f"{TALLY['writes']} writes ({TALLY['reader_failures']} failures, {TALLY['mislabeled']} mislabeled hits), "
            f"{TALLY['publish_kills']} kill -9 at a publishing step (old or new index opened every time), "
            f"{TALLY['tampered']} tampered manifests refused, {TALLY['truncations']} parts of a live generation "
            f"cut short under a reader or `retr serve` ({TALLY['truncation_errors']} answers a one-line error, "
            f"{TALLY['truncation_unchanged']} unchanged, {TALLY['deaths']} processes dead); "
            f"tracebacks {TALLY['tracebacks']}, "
            f"wrong results {TALLY['wrong_results']}, data lost {TALLY['data_lost']}")
    terminalreporter.write_line(line)
    out = os.environ.get("RETR_RELIABILITY_JSON")
    if out:
        with open(out, "w") as fh:
            json.dump(dict(TALLY), fh, indent=2)
