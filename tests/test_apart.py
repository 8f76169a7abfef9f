"""``backends.apart``: a child process's retr log records come back as this process's records."""

from __future__ import annotations

import logging

import pytest

from retr.retrieval.backends import apart

CHILD = """import logging, sys
from retr.retrieval.backends.apart import relay_logs
relay_logs(int(sys.argv[1]))
log = logging.getLogger("retr.child.work")
log.debug("not asked for")
log.warning("two lines\\nwith a tab\\t and a backslash \\\\n, " + sys.argv[2])
print("a third party's line", file=sys.stderr)
if sys.argv[3] == "refuse":
    print("refused: the graph is too noisy", file=sys.stderr); sys.exit(2)
sys.exit(int(sys.argv[3]))
"""


def test_records_come_back_through_this_process_s_loggers(caplog, capfd):
    caplog.set_level(logging.INFO, logger="retr")
    assert apart.run(CHILD, ["x", "0"]) is None
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("retr.child")]
    assert got == [("retr.child.work", logging.WARNING, "two lines\nwith a tab\t and a backslash \\n, x")]
    err = capfd.readouterr().err  # (the record printed there only by a handler of this process, e.g. the CLI's)
    assert "a third party's line" in err and "retr-log" not in err and '"two lines' not in err


def test_a_refusal_is_returned_and_a_failure_raised():
    assert apart.run(CHILD, ["y", "refuse"]) == "the graph is too noisy"
    with pytest.raises(RuntimeError, match="exit 3"):
        apart.run(CHILD, ["y", "3"])
