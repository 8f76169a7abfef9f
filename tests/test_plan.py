"""The stored graph plan and its cost model: priors are data with their sources, the plan is made once and stored,
and a cache look-up reads it without timing or tokenising anything."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from retr.indexes.build import IndexConfig, build_index
from retr.indexes.corpus import corpus_of
from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends import chooser, cost, registry, timing
from retr.retrieval.backends.plan import PlanStore
from retr.retrieval.backends.platform import Platform
from retr.retrieval.corpus_speeds import DocumentSpeeds
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.types import Document

DEFAULT = registry.DEFAULT_BACKEND
VNNI = Platform.of({"avx2", "avx512f", "avx512_vnni"}, cpu="VNNI, planned")  # int8 dot products, fp32 base graph
SPEEDS = {"openvino": 2.0, "openvino-int8": 0.5}  # seconds per token (fake): static int8 pays for any corpus


def test_every_prior_is_data_with_a_value_a_unit_and_its_source_and_the_cost_model_reads_it(monkeypatch):
    shipped = json.loads(cost.PRIORS_FILE.read_text())
    entries = {k: v for k, v in shipped.items() if isinstance(v, dict)}
    assert entries and all({"value", "unit", "source"} <= set(v) and v["source"] for v in entries.values())
    assert VNNI.int8_prior == entries["int8_over_fp32"]["value"]
    assert Platform.of({"avx2"}).int8_prior == entries["int8_emulated"]["value"]
    brk = cost.calibration_pays(1000, 0.01, VNNI)
    assert brk.calibration_s == entries["calibration_s"]["value"] and not brk.measured
    changed = {**entries, "int8_over_fp32": {**entries["int8_over_fp32"], "value": 3.0},
               "calibration_s": {**entries["calibration_s"], "value": 7.0}}
    monkeypatch.setattr(cost, "priors", lambda: changed)  # another file: other figures, no code changed
    assert VNNI.int8_prior == 3.0 and cost.calibration_pays(1000, 0.01, VNNI).calibration_s == 7.0


def _fake_speeds(monkeypatch, timed: list) -> None:
    def seconds(self, graph):
        timed.append(graph.variant)
        return SPEEDS[graph.variant]

    monkeypatch.setattr(DocumentSpeeds, "token_seconds", seconds)
    monkeypatch.setattr(DocumentSpeeds, "tokens_seconds_alternating", lambda self, gs: [seconds(self, g) for g in gs])


def _no_timer(monkeypatch) -> None:
    """Every timer (the real ones and the fakes) and the corpus's tokenisation raise from here on."""
    def fail(*a, **k):
        pytest.fail("a cache look-up timed or tokenised")

    for module, name in ((timing, "time_alternating"), (timing, "time_per_unit"), (chooser, "time_alternating"),
                         (chooser, "time_per_unit"), (DocumentSpeeds, "token_seconds"),
                         (DocumentSpeeds, "tokens_seconds_alternating")):
        monkeypatch.setattr(module, name, fail)


def _encoder(tiny_bi_encoder, platform=VNNI) -> BiEncoder:
    enc = BiEncoder(EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))
    enc.__dict__["platform"] = platform
    return enc


def _corpus(word: str, n: int) -> list[str]:
    return [f"{word} {i} about wolves and forests" for i in range(n)]


def test_a_cache_look_up_calls_no_timer_once_the_plan_is_stored(tiny_bi_encoder, monkeypatch):
    """A first corpus weighs the calibration (timed, calibrated, stored); from then on the plan is settled and a
    look-up of any new corpus's graph key reads it: no timer runs, nothing is tokenised, and the key is the graph
    that encoding it then takes."""
    monkeypatch.delenv("RETR_INT8_DOT")
    monkeypatch.setenv("RETR_BF16", "0")  # an fp32 base graph, as on the platform
    timed = []
    _fake_speeds(monkeypatch, timed)
    first = _encoder(tiny_bi_encoder)
    assert not first.planner.stored_plan().settled  # int8 runs here and is not calibrated: weighed on first use
    assert first.encode_corpus(_corpus("wolves", 40)).graph["backend"] == DEFAULT and timed
    plan = _encoder(tiny_bi_encoder).planner.stored_plan()  # made from what the first run stored
    assert plan.settled and plan.large_graph == "calibrated"
    assert PlanStore(cache_home()).get(plan.key) == plan
    _no_timer(monkeypatch)
    later = _encoder(tiny_bi_encoder)
    monkeypatch.setattr(later.tokens, "counted", lambda texts: pytest.fail("the corpus was tokenised"))
    monkeypatch.setattr(later.tokens, "ids", lambda texts: pytest.fail("the corpus was tokenised"))
    large, small = later.planner.graph_id(_corpus("rivers", 50)), later.planner.graph_id(_corpus("rivers", 5))
    assert large.startswith(f"{DEFAULT}@") and large == plan.large
    assert small == later.exported.identity(later.graph).key == plan.small
    # the calibrated graph it names gone from the cache: the plan is made again, the next corpus weighed again
    gone = _encoder(tiny_bi_encoder)
    shutil.rmtree(gone.exported.find(DEFAULT, gone.planner.calibration).path.parent)
    assert not _encoder(tiny_bi_encoder).planner.stored_plan().settled


def test_a_damaged_plan_is_made_again_with_a_warning_and_nothing_timed(tiny_bi_encoder, monkeypatch, caplog):
    enc = _encoder(tiny_bi_encoder, Platform.of({"avx2"}, cpu="AVX2, planned"))  # int8 not a candidate here
    plan = enc.planner.stored_plan()
    assert plan.settled and plan.large == plan.small  # the size changes nothing here
    path = PlanStore(cache_home()).path(plan.key)
    path.write_text(path.read_text().replace('"min_docs": 30', '"min_docs": "many"'))
    _no_timer(monkeypatch)
    with caplog.at_level(logging.WARNING):
        again = _encoder(tiny_bi_encoder, enc.platform).planner.stored_plan()
    assert again == plan and "unreadable" in caplog.text
    assert PlanStore(cache_home()).get(plan.key) == plan  # stored again, whole


def test_a_second_index_of_a_new_corpus_after_the_plan_is_stored_logs_no_timing_and_no_calibration(
        tiny_bi_encoder, monkeypatch, tmp_path, caplog):
    """A first `retr index` weighs and calibrates (its timings and the plan stored); a second one of a new corpus,
    in a new encoder as a new process has, reads the plan: no timer called, nothing calibrated, and no line about
    either logged."""
    monkeypatch.delenv("RETR_INT8_DOT")
    monkeypatch.setenv("RETR_BF16", "0")
    timed = []
    _fake_speeds(monkeypatch, timed)
    cfg = IndexConfig(encoder=EncoderConfig(model=str(tiny_bi_encoder), calibration_min_docs=30))

    def index(word: str, n: int, out: str) -> dict:
        docs = [Document(f"{word}{i}", "", text) for i, text in enumerate(_corpus(word, n))]
        return build_index(corpus_of(docs, tmp_path / word), tmp_path / out, cfg, encoder=_encoder(tiny_bi_encoder))

    with caplog.at_level(logging.DEBUG, logger="retr"):
        index("wolves", 40, "first")
    assert timed and any("calibrating static int8" in r.getMessage() for r in caplog.records)
    caplog.clear()
    _no_timer(monkeypatch)
    with caplog.at_level(logging.INFO, logger="retr"):
        manifest = index("rivers", 45, "second")
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "calibrat" in m or "ms/doc" in m or "timed" in m], said
    assert json.dumps(manifest).count(DEFAULT) >= 1  # encoded through the calibrated graph the plan names
