"""Which MatMuls dynamic int8 may quantise: the ranking noise each variant's query vectors add against fp32, and
a lone query's latency, on retr's fixed sample, all quantised from one fp32 ONNX export.

    python benchmarks/dynamic_int8_variants.py --onnx $RETR_CACHE/onnx/<model hash>-onnx/model.onnx
                                               [--out benchmarks/results/dynamic-int8-variants.json]

The fp32 graph is the `onnx` backend's (made by `retr doctor --export`). The noise is
``QueryGraphs.noise``: retr's 47 sample questions through the variant, one at a time, against the fp32
graph's, scored against its 62 sample passages (the figure the query check bounds). Latency: the first 8 sample
questions one at a time, one thread, median of 30 passes. retr's `onnx-int8` is the variant "down-projections
fp32" (``export.down_projections``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu, write_result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", required=True, help="a bi-encoder's fp32 ONNX graph (the onnx backend's model.onnx)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dynamic-int8-variants.json"))
    args = ap.parse_args(argv)

    import numpy as np
    import onnx
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from retr.retrieval.backends import sample_texts
    from retr.retrieval.backends.export import down_projections, pair_noise, quantize_dynamic_int8
    from retr.retrieval.models import bundled_model_path

    src = Path(args.onnx)
    tok = AutoTokenizer.from_pretrained(str(bundled_model_path()))  # the bundled MiniLM
    matmuls = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node if n.op_type == "MatMul"]

    def session(path):
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def feed(text):
        e = tok(text, truncation=True, max_length=256, return_tensors="np")
        return {"input_ids": e["input_ids"].astype(np.int64), "attention_mask": e["attention_mask"].astype(np.int64)}

    def encode(s, texts):
        return np.concatenate([s.run(None, feed(t))[0] for t in texts])

    def latency_ms(s):
        feeds = [feed(t) for t in sample_texts.questions()[:8]]
        for f in feeds:
            s.run(None, f)
        passes = []
        for _ in range(30):
            t0 = time.perf_counter()
            for f in feeds:
                s.run(None, f)
            passes.append((time.perf_counter() - t0) / len(feeds))
        return statistics.median(passes) * 1000

    questions, passages = sample_texts.questions(), sample_texts.passages() + sample_texts.long_passages()
    fp32 = session(src)
    ref_q, ref_d = encode(fp32, questions), encode(fp32, passages)
    variants = {
        "every weight MatMul int8": [],
        "down-projections fp32 (retr's onnx-int8)": down_projections(src),
        "first layer fp32": [n for n in matmuls if "layer.0/" in n],
        "last layer fp32": [n for n in matmuls if "layer.5/" in n],
        "attention output projections fp32": [n for n in matmuls if "attention/output/dense" in n],
    }
    rows = {"fp32": {"rank_noise": 0.0, "ms_per_query": latency_ms(fp32)}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, exclude in variants.items():
            dst = Path(tmp) / "model.onnx"
            quantize_dynamic_int8(src, dst, None, exclude, keep=True)  # as retr quantises onnx-int8
            s = session(dst)
            noise = pair_noise(ref_q @ ref_d.T, encode(s, questions) @ ref_d.T)  # as QueryGraphs.noise
            rows[name] = {"fp32_matmuls": len(exclude), "rank_noise": noise, "ms_per_query": latency_ms(s)}
            print(f"{name:45s} noise {rows[name]['rank_noise']:.4f}  {rows[name]['ms_per_query']:.2f} ms", flush=True)
    write_result(args.out, {"cpu": cpu(), "onnx": str(src), "variants": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
