"""Whether a corpus pays for calibrating its model's static int8 graph here, and what it goes through where it does
not: the base graph, or the int8 graph made without calibration where that is measured faster. Weighed on the
stored per-token speeds (``corpus_speeds``), the priors (``backends/priors.json``) and the pure cost model
(``cost.calibration_pays``); the graph plan (``CorpusPlanner``) asks it for a corpus its stored plan leaves open."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from retr.retrieval.backends import chooser, cost
from retr.retrieval.backends.cost import prior
from retr.retrieval.errors import RetrError

logger = logging.getLogger("retr.retrieval.corpus_plan")  # said as the plan's: one logger for the documents' graph

# the priors (assumed until measured here), each with its source: ``priors.json``
STATIC_OVER_WEIGHTS = prior("static_over_weights")  # static int8 over the int8-weights graph, until measured
WEIGHTS_MAKE_S = prior("weights_make_s")  # making the int8-weights graph from the base graph and checking it
WEIGHTS_TIME_S = prior("weights_time_s")  # ... and timing it
# the base graph goes untimed where, its speed estimated from this CPU's precision probe, static int8 would still
# save more than this many times its calibration's cost (``_estimated_break``)
ESTIMATE_MARGIN = prior("estimate_margin")


class Weighing:
    """The calibration break of one model's corpora (``planner``: the plan whose graphs it weighs and makes)."""

    def __init__(self, planner):  # a CorpusPlanner (which imports this module)
        self.p = planner

    def calibration_break(self, docs: int, tokens: int) -> cost.Break | None:
        """Whether ``docs`` documents of ``tokens`` tokens in all pay for calibrating the static int8 graph, and
        what they go through where it does not. The static int8 graph timed here where it is already calibrated
        (then it costs nothing more) against the base graph. Else, on a CPU where int8 is assumed faster
        (``Platform.int8_prior`` > 1), the base graph timed here, and static int8 assumed from the platform
        (``cost.calibration_pays``); unless that clearly pays (``_calibration_clearly_pays``), the int8 graph
        made without calibration (``weights_graph``, ~3-5 s to make and check, once per model) is timed too, and
        where it is more than ``NOISE_FREE_MARGIN`` faster than the base graph static int8 is assumed
        ``STATIC_OVER_WEIGHTS`` times faster than it and weighed against it; it is neither made nor timed where,
        assumed ``Platform.weights_prior`` times the base graph, it could not save the corpus what weighing it
        costs this run (``_weights_may_pay``). The two graphs' timings are stored once per model, graphs, CPU and
        versions: a later corpus times neither.
        None, with nothing timed, where int8 is not made yet and assumed no faster here (AMX): no corpus could
        pay, so timing (~1.5 s of a first run) would decide nothing. Said in an info line."""
        per_doc = tokens / max(1, docs)
        cached = self.p.exported.find(self.p.configured, self.p.calibration)
        quiet = False  # both graphs' speeds read from the store: nothing weighed now, said at debug level only
        if cached is not None:
            self.p.__dict__["calibrated_graph"] = cached
            quiet = self.p.speeds.stored_per_token(cached) is not None
            speeds = self.p.speeds.measured_per_token(cached)
            brk = replace(cost.calibration_pays(docs, speeds.base * per_doc, self.p.platform, speeds.int8 * per_doc,
                                                   0.0), base_estimated=speeds.base_estimated)
        elif self.p._none_can_pay(docs):  # int8 assumed no faster here, and not made
            return None
        else:
            name = self.p._weights_name
            key = self.p.speeds.weights_key(name)
            stored = self.p.speeds.stored_pair(key, name) if name else None  # both graphs, timed here before
            estimated = self._estimated_break(docs, per_doc) if stored is None else None
            if estimated is not None:
                self._log_break(estimated, per_doc)
                return estimated
            base_s = stored.base * per_doc if stored else self.p.speeds.doc_seconds(self.p.graph, per_doc)
            # static int8 as the platform assumes it against the base graph, its calibration as the prior says
            brk = cost.calibration_pays(docs, base_s, self.p.platform)
            weighing_s = 0.0 if stored else self.weights_cost_s()
            if not self._calibration_clearly_pays(brk, weighing_s) \
                    and (stored or (self._weights_may_pay(docs, base_s, weighing_s) and self.p.weights_graph is not None)):
                weights_s = stored.int8 * per_doc if stored else self.p.speeds.doc_seconds(self.p.weights_graph, per_doc)
                if not stored:
                    self.p.speeds.store_pair(key, base_s / per_doc, name, weights_s / per_doc)
                faster = chooser.faster_enough(base_s, weights_s) and self.p.weights_graph is not None
                logger.info("%s for %d documents: base graph %.1f ms/doc, %s %.1f ms/doc (%s): %s", self.p.configured,
                            docs, base_s * 1000, name, weights_s * 1000, "stored" if stored else "measured",
                            name if faster else "the base graph")
                if faster:  # static int8 assumed from this measured int8 graph: the nearer of the two in kind
                    brk = replace(brk, base_s=weights_s, int8_s=weights_s / STATIC_OVER_WEIGHTS, against=name,
                                  base_graph_s=base_s)
        self._log_break(brk, per_doc, logging.DEBUG if quiet else logging.INFO)
        return brk

    def _log_break(self, brk: cost.Break, per_doc: float, level: int = logging.INFO) -> None:
        logger.log(level, "%s for %d documents (%.0f tokens each): %s %.1f ms/doc%s, int8 %.1f ms/doc (%s), "
                    "calibration %.0f s: %s", self.p.configured, brk.docs, per_doc,
                    "base graph" if brk.against_base else brk.against, brk.base_s * 1000,
                    " (estimated from this CPU's precision probe, not timed)" if brk.base_estimated else "",
                    brk.int8_s * 1000, "measured" if brk.measured else "assumed", brk.calibration_s,
                    "int8" if brk.pays else f"{brk.against_phrase} ({brk.break_even_phrase()})")

    @functools.cached_property
    def spec(self):
        """The model's ``direct.BertSpec`` (its multiply-adds per token), or None where the graph is not built
        from a BERT's weights."""
        from retr.retrieval.backends.direct import bert_spec

        return bert_spec(self.p.exported.ref.path) if self.p.exported.ref.path is not None else None

    def _estimated_break(self, docs: int, per_doc: float) -> cost.Break | None:
        """Static int8 weighed against the base graph with the base graph's speed estimated instead of timed (~1
        s of a first run): its multiply-adds per document (``BertSpec.macs_per_token``) at the rate this CPU's
        precision probe measured in the base graph's precision (``PrecisionTiming.macs_per_second``), where static
        int8, assumed at the platform's prior, saves more than ``ESTIMATE_MARGIN`` times its calibration's prior
        cost and clearly pays against the int8-weights graph too (``_calibration_clearly_pays``). None where it
        does not, or where there is no probe or spec: the base graph is timed."""
        probe, spec = self.p.platform.precision_probe, self.spec
        if probe is None or spec is None:
            return None
        base_s = per_doc * spec.macs_per_token(per_doc) / probe.macs_per_second(self.p.graph.precision)
        brk = replace(cost.calibration_pays(docs, base_s, self.p.platform), base_estimated=True)
        wide = replace(brk, calibration_s=brk.calibration_s * ESTIMATE_MARGIN)
        return brk if wide.pays and self._calibration_clearly_pays(brk, self.weights_cost_s()) else None

    def weights_cost_s(self) -> float:
        """Seconds this run would spend weighing the int8-weights graph whose speed is not stored: made and
        checked (``WEIGHTS_MAKE_S``) unless the cache holds it, then timed (``WEIGHTS_TIME_S``); nothing where it
        was refused here before (``weights_graph`` says so once asked). A cached graph found here is the one
        ``weights_graph`` returns: not looked up and checked twice."""
        if "weights_graph" not in self.p.__dict__:
            name = self.p._weights_name
            try:
                found = self.p.exported.find(name) if name is not None and self.p.graph is not None else None
            except RetrError:  # refused here before: nothing will be made or timed
                return 0.0
            if found is None:
                return WEIGHTS_MAKE_S + WEIGHTS_TIME_S
            self.p.__dict__["weights_graph"] = found
        return WEIGHTS_TIME_S if self.p.__dict__["weights_graph"] is not None else 0.0

    def _weights_may_pay(self, docs: int, base_s: float, weighing_s: float) -> bool:
        """Whether an int8-weights graph ``Platform.weights_prior`` times faster than the base graph (``base_s``
        seconds a document) would save ``docs`` documents more than weighing it costs this run (``weighing_s``);
        else it is neither made nor timed, and says so (1,000 NPL-length documents, ~6 ms each through the fp32
        base graph on 2 cores: ~2.4 s saved for ~5 s spent; over a bf16 base graph, assumed ~1.1x, only a corpus
        on which static int8 clearly pays, so that this graph is not weighed, could repay it)."""
        saving = docs * base_s * (1 - 1 / self.p.platform.weights_prior)
        if saving > weighing_s:
            return True
        logger.info("%s for %d documents: %s not made, it would save ~%.1f s for ~%.1f s of making and timing it",
                    self.p.configured, docs, self.p._weights_name, saving, weighing_s)
        return False

    def _calibration_clearly_pays(self, brk: cost.Break, weights_cost_s: float) -> bool:
        """Whether static int8 (as ``brk`` assumes it) saves more than its calibration's cost even against an
        int8-weights graph ``Platform.weights_prior`` times faster than the base graph, once what weighing that
        graph would cost this run (``weights_cost_s``) is counted on its side: then that graph is neither made nor
        timed."""
        against_weights = replace(brk, base_s=brk.base_s / self.p.platform.weights_prior,
                                  calibration_s=max(0.0, brk.calibration_s - weights_cost_s))
        return brk.pays and against_weights.pays


__all__ = ["Weighing"]
