"""retr's own static int8 of an OpenVINO graph: SmoothQuant, then int8 weights (per output channel, symmetric) and
activations quantised with ranges measured on a calibration sample (per tensor, asymmetric), as FakeQuantize
operations that OpenVINO's CPU plugin runs as int8 MatMuls.

Where it quantises (what NNCF's transformer preset chose for MiniLM, read off its graph): every MatMul with a 2-D
constant weight, its activation first smoothed (one scale per input channel, shared by the MatMuls that read the
same tensor: a layer's query, key and value projections), and the attention scores' MatMul (queries times keys),
both inputs, unsmoothed; the MatMul that mixes values by the softmax's weights stays in the base precision.

What it measures: one pass of the base graph over the sample, one text per call (no padding in the statistics),
with each quantised tensor reduced in the graph to its per-channel minimum and maximum. The ranges follow
NNCF's defaults for this preset: weights' absolute maximum; activations' per-text minimum and maximum averaged
over the texts; SmoothQuant's scale per channel ``max|x|^a / max|w|^(1-a)``, ``a`` = 0.95, clipped below at its
10% quantile and above at 100, the group's scale the one whose smallest-to-largest ratio is the largest.
No fast bias correction: NNCF's graph without it added the same ranking noise on SciFact dev (0.0588 against
0.0580; benchmarks/results/calibration-cost-noamx-xeon.json). NNCF took 15.5 s on 2 cores for MiniLM (graph
matching, two statistics passes, 38 compilations for its bias correction); this takes ~2 s (AMX Xeon with AMX
refused; docs/studies/measured-choices-no-amx.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from retr.retrieval.backends.runners import default_threads

logger = logging.getLogger(__name__)

SMOOTH_ALPHA = 0.95  # SmoothQuant's migration strength for MatMuls (NNCF's default for transformers)
SMOOTH_QUANTILE = 0.1  # scales below this quantile of a tensor's scales are raised to it
SMOOTH_MAX = 100.0  # ... and none above this
ACTIVATION_LEVELS = 256  # u8 activations, zero point where the range puts it
WEIGHT_MAX = 127  # int8 weights in [-127, 127]: symmetric, zero exact
_PASS_THROUGH = {"Reshape", "Transpose", "Squeeze", "Unsqueeze"}  # ops that move values without changing them


@dataclass
class _Weighted:
    """A MatMul with a constant 2-D weight: the weight as float32, the axis of its input channels."""
    op: object
    weight: np.ndarray
    in_axis: int


def _constant_weight(op) -> np.ndarray | None:
    """The float32 value of a MatMul's second input where it is a 2-D constant (through a Convert), else None."""
    node = op.input_value(1).get_node()
    if node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant":
        return None
    value = node.get_data()
    return np.asarray(value, dtype=np.float32) if value.ndim == 2 else None


def _computed_at(op, port: int) -> tuple[object, int]:
    """The input (op, port) that reads ``op``'s input ``port`` where its values are computed, looking back through
    ops that only move them: ``op``'s own where none does."""
    while op.input_value(port).get_node().get_type_name() in _PASS_THROUGH:
        op, port = op.input_value(port).get_node(), 0
    return op, port


def _producer(op, port: int) -> object:
    """The op that computes the values ``op`` reads at input ``port`` (``_computed_at``)."""
    consumer, port = _computed_at(op, port)
    return consumer.input_value(port).get_node()


def _targets(model, feed_forward_only: bool) -> tuple[list[_Weighted], list[object]]:
    """The MatMuls to quantise: those with a constant weight (only the feed-forward ones, whose weights are not
    square, with ``feed_forward_only``) and, unless ``feed_forward_only``, those between two activations where
    neither comes from a softmax (attention scores)."""
    weighted, scores = [], []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        weight = _constant_weight(op)
        if weight is not None:  # (a transposed activation, which no exporter writes, is left as it is)
            if op.get_attributes().get("transpose_a") or (feed_forward_only and weight.shape[0] == weight.shape[1]):
                continue
            in_axis = 1 if op.get_attributes().get("transpose_b") else 0
            weighted.append(_Weighted(op, weight, in_axis))
        elif not feed_forward_only and all(_producer(op, i).get_type_name() != "Softmax" for i in range(2)):
            scores.append(op)
    return weighted, scores


def _observed(model, outputs: list, feeds: list[dict], per_channel: list[bool],
              seen: Callable[[dict, np.ndarray], None] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text of ``feeds``: each of ``outputs``' minimum and maximum, per channel (its last axis: shape
    ``(texts, channels)``) where ``per_channel`` says so, else over the whole tensor (shape ``(texts,)``), from one
    pass of ``model`` with the reductions added to it. ``seen``: given each feed and the model's own first output
    for it, from the same pass."""
    import openvino as ov
    from openvino import opset13 as ops

    results = [ops.result(model.get_results()[0].input_value(0))] if seen is not None else []
    first = len(results)  # the reductions' results start here
    for out, channels in zip(outputs, per_channel, strict=True):
        rank = out.get_partial_shape().rank.get_length()
        axes = ops.constant(np.arange(rank - 1 if channels else rank, dtype=np.int64))
        results += [ops.result(ops.reduce_min(out, axes, keep_dims=False)),
                    ops.result(ops.reduce_max(out, axes, keep_dims=False))]
    observer = ov.Model(results, model.get_parameters(), "retr-int8-statistics")
    streams = default_threads()  # one text a call, a stream a core (no synchronisation inside a call)
    compiled = ov.Core().compile_model(observer, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": streams,
                                                         "INFERENCE_PRECISION_HINT": "f32"})
    per_text: list = [None] * len(feeds)
    requests = ov.AsyncInferQueue(compiled, streams)

    def done(request, i):
        per_text[i] = [request.get_output_tensor(k).data.copy() for k in range(len(results))]

    requests.set_callback(done)
    for i, feed in enumerate(feeds):
        requests.start_async(feed, i)
    requests.wait_all()
    if seen is not None:
        for feed, t in zip(feeds, per_text, strict=True):
            seen(feed, t[0][0])
    return [(np.stack([t[first + 2 * k] for t in per_text]), np.stack([t[first + 2 * k + 1] for t in per_text]))
            for k in range(len(outputs))]


def smooth_scales(act_absmax: np.ndarray, weight_absmax: list[np.ndarray], alpha: float = SMOOTH_ALPHA) -> np.ndarray:
    """SmoothQuant's per-channel scale for an activation read by MatMuls with these weights' per-input-channel
    absolute maxima: each weight's candidate ``a^alpha / w^(1-alpha)`` clipped to [its 10% quantile, 100]; the
    group takes the candidate with the largest smallest-to-largest ratio (the flattest)."""
    eps = np.finfo(np.float32).eps
    a = np.maximum(act_absmax, 1e-5)
    best, best_ratio = None, -1.0
    for w in weight_absmax:
        s = a ** alpha / (np.maximum(w, 1e-5) ** (1 - alpha) + eps)
        s = np.clip(s, np.quantile(s, SMOOTH_QUANTILE), SMOOTH_MAX)
        ratio = float(s.min() / (s.max() + eps))
        if ratio > best_ratio:
            best, best_ratio = s, ratio
    return best.astype(np.float32)


def activation_range(lows: np.ndarray, highs: np.ndarray) -> tuple[float, float]:
    """A per-tensor u8 range from per-text minima and maxima: their means, widened to hold zero and moved so that
    zero is one of the 256 levels (padding and ReLU-like zeros stay exact)."""
    low, high = min(float(np.mean(lows)), 0.0), max(float(np.mean(highs)), 0.0)
    if high - low < 1e-8:
        high = low + 1e-8
    step = (high - low) / (ACTIVATION_LEVELS - 1)
    zero = round(-low / step)
    low = -zero * step
    return low, low + step * (ACTIVATION_LEVELS - 1)


def signed_range(lows: np.ndarray, highs: np.ndarray) -> tuple[float, float]:
    """A per-tensor i8 range, zero in the middle (levels -128..127): the per-text absolute maxima averaged over the
    texts. The attention scores' inputs take it: OpenVINO fuses the attention around signed int8 inputs, and ran
    it apart, in fp32, around unsigned ones with a zero point (measured: 15 against 11 s for 1,000 documents)."""
    top = max(float(np.mean(np.maximum(np.abs(lows), np.abs(highs)))), 1e-8)
    half = ACTIVATION_LEVELS // 2
    return -top, top * (half - 1) / half


def _fake_quantize(output, low: float, high: float):
    from openvino import opset13 as ops

    lo, hi = ops.constant(np.float32(low)), ops.constant(np.float32(high))
    return ops.fake_quantize(output, lo, hi, lo, hi, ACTIVATION_LEVELS)


def int8_weight(weight: np.ndarray, in_axis: int):
    """``weight`` as int8 per output channel (symmetric) and its dequantisation: Constant(i8) -> Convert ->
    Multiply by the channel's scale, the form OpenVINO's CPU plugin runs as an int8 MatMul."""
    from openvino import Type
    from openvino import opset13 as ops

    absmax = np.max(np.abs(weight), axis=in_axis, keepdims=True)
    scale = np.where(absmax > 0, absmax / WEIGHT_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return ops.multiply(ops.convert(ops.constant(q), Type.f32), ops.constant(scale))


def quantize(model, feeds: list[dict], feed_forward_only: bool = False,
             seen: Callable[[dict, np.ndarray], None] | None = None):
    """``model`` (an OpenVINO model, changed in place and returned) with static int8 MatMuls calibrated on
    ``feeds`` (one text each). ``seen``: given each feed and the unquantised model's first output for it, from
    the statistics pass (a text's vector, where the model embeds)."""
    from openvino import opset13 as ops

    weighted, scores = _targets(model, feed_forward_only)
    if not weighted and not scores:
        return model
    groups: dict[tuple, list[_Weighted]] = {}  # MatMuls that read the same activation
    for w in weighted:
        src = w.op.input_value(0)
        groups.setdefault((src.get_node().get_friendly_name(), src.get_index()), []).append(w)
    group_inputs = [g[0].op.input_value(0) for g in groups.values()]
    score_inputs = [op.input_value(i) for op in scores for i in range(2)]
    stats = _observed(model, group_inputs + score_inputs, feeds,
                      [True] * len(group_inputs) + [False] * len(score_inputs), seen)

    for (lows, highs), members in zip(stats[: len(groups)], groups.values(), strict=True):
        act_absmax = np.maximum(np.abs(lows), np.abs(highs)).max(axis=0)
        w_absmax = [np.max(np.abs(m.weight), axis=1 - m.in_axis) for m in members]
        s = smooth_scales(act_absmax, w_absmax)
        source = members[0].op.input_value(0)
        smoothed = ops.multiply(source, ops.constant((1.0 / s).astype(np.float32)))
        fq = _fake_quantize(smoothed.output(0), *activation_range((lows / s).min(axis=1), (highs / s).max(axis=1)))
        for m in members:
            shape = [1, 1]
            shape[m.in_axis] = len(s)
            m.op.input(0).replace_source_output(fq.output(0))
            m.op.input(1).replace_source_output(int8_weight(m.weight * s.reshape(shape), m.in_axis).output(0))
    for (lows, highs), (op, i) in zip(stats[len(groups):], [(op, i) for op in scores for i in range(2)],
                                      strict=True):
        # at the op that computes the values, before the heads' reshapes: OpenVINO then fuses the attention with
        # its int8 inputs (quantised after the reshapes, it ran apart, in fp32, with the quantisations on their own)
        consumer, port = _computed_at(op, i)
        fq = _fake_quantize(consumer.input_value(port), *signed_range(lows, highs))
        consumer.input(port).replace_source_output(fq.output(0))
    for op in model.get_ordered_ops():  # embedding tables: int8 rows, dequantised where gathered
        if op.get_type_name() == "Gather" and op.input_value(0).get_node().get_type_name() == "Constant":
            table = op.input_value(0).get_node().get_data()
            if table.ndim == 2 and table.dtype.kind == "f":
                op.input(0).replace_source_output(int8_weight(np.asarray(table, np.float32), 1).output(0))
    model.validate_nodes_and_infer_types()
    logger.debug("static int8: %d MatMuls with weights in %d groups, %d between activations", len(weighted),
                 len(groups), len(scores))
    return model


__all__ = ["activation_range", "int8_weight", "quantize", "signed_range", "smooth_scales"]
