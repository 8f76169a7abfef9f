"""How much each encoding graph of a bi-encoder moves its rankings away from the torch model's: the figure
retr's check refuses a graph on (``backends.export.rank_noise``), for the bf16 graph and the int8 ones side by side
(benchmarks/int8_quality.py reports it beside the quality each costs)."""

from __future__ import annotations


def graph_noise(model: str) -> dict[str, float]:
    """rank_noise of ``model``'s bf16 OpenVINO graph, its dynamic int8 ONNX query graph and each static int8
    document graph that calibrates, each against the same torch reference, on retr's fixed sample."""
    from retr.retrieval.backends.export import TorchEmbedding, rank_noise
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    enc = BiEncoder(EncoderConfig(model=model, backend="openvino", query_backend="onnx-int8"))
    torch_ref = TorchEmbedding(enc.model)  # every graph against the torch model
    out = {"openvino (bf16)": rank_noise(enc.graph.runner, torch_ref, enc.max_length),
           "onnx-int8 (queries)": rank_noise(enc.query_graph.runner, torch_ref, enc.max_length)}
    for int8 in ("openvino-int8", "openvino-int8-ffn"):
        graph = BiEncoder(EncoderConfig(model=model, backend=int8)).calibrated_graph
        if graph is not None:
            out[f"{int8} (documents)"] = rank_noise(graph.runner, torch_ref, enc.max_length)
    return out
