"""The reranker check takes a weight above 0 only where the pseudo-queries' gain is reliable: the lower end of a
paired bootstrap interval of the mean nDCG@10 gain over the first stage must be above 0; the bound is stored with
the check and shown with the choice."""

from __future__ import annotations

import numpy as np

from retr.eval.pseudo import gain_bounds
from retr.eval.table import reranker_line
from retr.retrieval.rerank import CorpusCheck, checked_weight

# a curve whose smoothed best is 0.4 (+0.007 over the first stage alone, as the noisy choices measured)
CURVE = {f"{w / 10:.1f}": v for w, v in enumerate([0.500, 0.501, 0.503, 0.506, 0.507, 0.506, 0.503, 0.499, 0.49,
                                                    0.48, 0.47])}


def test_a_weight_is_taken_only_where_its_gain_is_reliable():
    assert checked_weight(CURVE, None) == 0.4  # a check stored before the bound keeps its curve's weight
    assert checked_weight(CURVE, {w: 0.002 for w in CURVE if w != "0.0"}) == 0.4
    assert checked_weight(CURVE, {**{w: 0.002 for w in CURVE if w != "0.0"}, "0.4": -0.001}) == 0.0
    flat = {w: 0.5 for w in CURVE}
    assert checked_weight(flat, {w: 0.1 for w in CURVE if w != "0.0"}) == 0.0  # the first stage alone: 0


def test_bootstrap_bound_tells_noise_from_a_gain():
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 200)
    noisy = np.clip(base + rng.normal(0.007, 0.15, 200), 0, 1)  # +0.007 on average, +-0.15 per query
    steady = np.clip(base + 0.02, 0, 1)  # +0.02 on (nearly) every query
    bounds = gain_bounds({"0.0": base, "0.4": noisy, "0.5": steady})
    assert set(bounds) == {"0.4", "0.5"}
    assert bounds["0.4"] < 0 < bounds["0.5"]
    assert gain_bounds({"0.0": base, "0.4": noisy}) == {"0.4": bounds["0.4"]}  # seeded: the same bound again


def test_a_stored_check_is_loaded_with_the_bound_applied_and_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("RETR_CACHE", str(tmp_path))
    low = {w: -0.004 for w in CURVE if w != "0.0"}
    check = CorpusCheck(corpus_sha256="c" * 64, reranker_hash="r", first_stage="hybrid", first_stage_model="m",
                        depth=20, max_length=128, queries=200, seed=7, weight=0.0, curve=CURVE,
                        first_stage_ndcg=CURVE["0.0"], seconds=1.0, gain_low=low)
    check.save("k")
    loaded = CorpusCheck.load("k")
    assert loaded is not None and loaded.weight == 0.0 and loaded.gain_low == low
    line = reranker_line({"weight": 0.0, "weight_source": "checked", "corpus_check": check.__dict__})
    assert "best weight 0.4: gain +0.0070, 95% bootstrap lower bound -0.0040 (not reliable: not taken)" in line
