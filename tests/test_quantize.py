"""retr's own static int8 (``retrieval/backends/quantize.py``): SmoothQuant's scales, the activation ranges, where
FakeQuantize goes, and the graph OpenVINO's CPU plugin makes of it."""

from __future__ import annotations

import numpy as np
import pytest

from retr.retrieval.backends import direct, quantize
from retr.retrieval.backends.runners import OpenVinoRunner

TEXTS = ["solar panels", "wolves hunt in packs and live in forests and tundra " * 3, "tea",
         "coffee beans are roasted ground and brewed with hot water", "x"]


def test_smooth_scales_follow_the_formula_clip_at_the_quantile_and_take_the_flattest_weight():
    act = np.array([1.0, 4.0, 9.0, 100.0, 0.0], dtype=np.float32)
    w_flat = np.ones(5, dtype=np.float32)
    w_steep = np.array([1.0, 1.0, 1.0, 1e-4, 1.0], dtype=np.float32)
    alpha = 0.5
    got = quantize.smooth_scales(act, [w_steep, w_flat], alpha=alpha)
    raw = np.maximum(act, 1e-5) ** alpha / (w_flat ** (1 - alpha) + np.finfo(np.float32).eps)
    want = np.clip(raw, np.quantile(raw, quantize.SMOOTH_QUANTILE), quantize.SMOOTH_MAX)
    np.testing.assert_allclose(got, want, rtol=1e-5)  # the flat weight's scales: the steep one's spread wider
    assert got.min() > np.maximum(act, 1e-5).min() ** alpha  # the zero channel raised to the 10% quantile
    steep = quantize.smooth_scales(act, [w_steep], alpha=alpha)
    assert steep.max() == pytest.approx(quantize.SMOOTH_MAX)  # a tiny weight channel: clipped at 100


@pytest.mark.parametrize("lows,highs", [([-1.0, -3.0], [2.0, 6.0]), ([0.5, 1.0], [3.0, 5.0]), ([-4.0], [-1.0])])
def test_an_activation_range_holds_the_mean_extremes_and_zero_exactly(lows, highs):
    low, high = quantize.activation_range(np.array(lows), np.array(highs))
    step = (high - low) / (quantize.ACTIVATION_LEVELS - 1)
    assert low <= min(np.mean(lows), 0.0) + step and high >= max(np.mean(highs), 0.0) - step
    zero = -low / step
    assert abs(zero - round(zero)) < 1e-6  # zero is one of the levels
    assert high - low == pytest.approx(max(np.mean(highs), 0) - min(np.mean(lows), 0), rel=0.02)


def test_a_signed_range_is_centred_on_zero_with_one_level_more_below():
    low, high = quantize.signed_range(np.array([-2.0, -1.0]), np.array([1.0, 3.0]))  # |extremes| 2 and 3: mean 2.5
    assert low == pytest.approx(-2.5) and high == pytest.approx(2.5 * 127 / 128)


def test_an_int8_weight_node_dequantises_each_output_channel_within_half_its_step():
    import openvino as ov

    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -2.0]], dtype=np.float32)  # (out, in)
    node = quantize.int8_weight(w, in_axis=1)
    compiled = ov.Core().compile_model(ov.Model([node.output(0)], [], "w"), "CPU")
    got = compiled({})[0]
    q = node.input_value(0).get_node().input_value(0).get_node().get_data()
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and (q[1] == 0).all()
    np.testing.assert_allclose(got, w, atol=np.abs(w).max(axis=1, keepdims=True).max() / 254)


def _built(tiny_bi_encoder, tmp_path):
    import openvino as ov

    built = direct.build_embedding(tiny_bi_encoder)
    ov.save_model(built.model, str(tmp_path / "base.xml"), compress_to_fp16=False)
    feeds = [built.reference.feed([t], 64) for t in TEXTS * 3]
    return built, feeds


def test_quantize_places_fake_quantize_where_the_transformer_preset_does(tiny_bi_encoder, tmp_path):
    import openvino as ov

    built, feeds = _built(tiny_bi_encoder, tmp_path)
    model = ov.Core().read_model(str(tmp_path / "base.xml"))
    matmuls = [op for op in model.get_ops() if op.get_type_name() == "MatMul"]
    layers = len([op for op in model.get_ops() if op.get_type_name() == "Softmax"])
    quantize.quantize(model, feeds)
    ops = model.get_ordered_ops()
    fq = [op for op in ops if op.get_type_name() == "FakeQuantize"]
    # per layer: the Q/K/V input (one, shared), the attention output, the feed-forward's two, queries and keys
    assert len(fq) == 6 * layers
    for op in matmuls:
        sources = [op.input_value(i).get_node() for i in range(2)]
        if any(s.get_type_name() == "Softmax" for s in sources):  # values mixed by the softmax: not quantised
            assert all(s.get_type_name() != "FakeQuantize" for s in sources)
        elif sources[1].get_type_name() == "Multiply":  # a weight: int8, dequantised per output channel
            assert sources[0].get_type_name() == "FakeQuantize"
            assert sources[1].input_value(0).get_node().input_value(0).get_node().get_element_type() == ov.Type.i8
    # the query, key and value projections read one smoothed, quantised tensor
    shared = [f for f in fq if sum(t.get_node().get_type_name() == "MatMul"
                                   for t in f.output(0).get_target_inputs()) == 3]
    assert len(shared) == layers
    tables = [op.input_value(0).get_node() for op in ops if op.get_type_name() == "Gather"
              and op.input_value(0).get_node().get_type_name() == "Multiply"]
    assert tables  # the embedding tables in int8 too
    # never the pooled vector before its normalisation
    norm = next(op for op in ops if op.get_type_name() == "NormalizeL2")
    assert norm.input_value(0).get_node().get_type_name() != "FakeQuantize"


def test_a_quantised_graph_stays_close_and_runs_its_matmuls_and_attention_in_int8(tiny_bi_encoder, tmp_path):
    import openvino as ov

    from retr.retrieval.backends.platform import INT8_DOT_FLAGS, this_platform

    built, feeds = _built(tiny_bi_encoder, tmp_path)
    model = ov.Core().read_model(str(tmp_path / "base.xml"))
    ov.save_model(quantize.quantize(model, feeds), str(tmp_path / "q.xml"), compress_to_fp16=False)
    base, q = OpenVinoRunner(tmp_path / "base.xml", 1, "fp32"), OpenVinoRunner(tmp_path / "q.xml", 1, "fp32")
    batch = built.reference.feed(TEXTS, 64)
    assert (base(batch) * q(batch)).sum(1).min() > 0.97
    if this_platform().flags.isdisjoint(INT8_DOT_FLAGS):  # the host's instructions, not RETR_INT8_DOT's override
        pytest.skip("no int8 dot-product instructions on this CPU: OpenVINO runs the quantised graph in fp32")
    runtime = q.compiled.get_runtime_model().get_ops()
    kinds = {(str(op.get_rt_info()["layerType"].astype(str)), str(op.get_rt_info()["runtimePrecision"].astype(str)))
             for op in runtime}
    assert ("FullyConnected", "f32") not in kinds and ("FullyConnected", "u8") in kinds
    # queries and keys quantised symmetric: OpenVINO keeps the attention one fused int8 subgraph
    assert ("Subgraph", "i8") in kinds and ("FakeQuantize", "f32") not in kinds
