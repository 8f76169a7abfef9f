"""How a graph is made, timed: the same model's graph made two ways (``--graphs A,B``), both run by OpenVINO on
one stream at the given precision, alternating call by call so that drift on a shared machine falls on both;
median and minimum per shape, the speed-up of B over A, and the largest difference between the two graphs'
outputs. The ways: ``sdpa``, retr's exporter with torch's SDPA attention as the model loads (TorchScript
decomposes it: masking through IsNaN/Select); ``eager``, with eager attention (generation 3:
``export.eager_attention``; OpenVINO fuses it); ``built``, written from the weights with OpenVINO's own
operations, no torch (generation 4, bi-encoders of BERT models: ``retrieval/backends/direct.py``).

    python benchmarks/attention_export.py [--graphs sdpa,eager|eager,built] [--cross-encoder DIR]
        [--precision bf16|f32] [--rounds 20] [--shapes 32x256,16x128,1x16] [--threads 1]
        --out benchmarks/results/attention-export.json

Without ``--cross-encoder`` it times the bundled MiniLM bi-encoder's graph (ids + mask -> vector); with one, that
cross-encoder's graph (ids + mask + token types -> logit), e.g. at 10x128: one stream's half of a query's 20
pairs at 128 tokens.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _graphs(ways: list[str], cross_encoder: str | None, folder: Path) -> dict[str, tuple[Path, float]]:
    """Each way's graph file and the seconds it took to make (the torch model loaded once, outside that time)."""
    from retr.retrieval.backends.export import export_embedding, export_scoring
    from retr.retrieval.models import bundled_model_path

    out = {}
    model = None
    for name in ways:
        if name == "built":
            import openvino as ov

            from retr.retrieval.backends.direct import build_embedding

            if cross_encoder:
                raise SystemExit("--graphs built: bi-encoders only (a cross-encoder's graph is exported from torch)")
            t0 = time.perf_counter()
            built = build_embedding(bundled_model_path())
            path = folder / "built.xml"
            ov.save_model(built.model, str(path), compress_to_fp16=False)
            out[name] = (path, time.perf_counter() - t0)
            continue
        if model is None:
            if cross_encoder:
                from sentence_transformers import CrossEncoder

                model = CrossEncoder(cross_encoder, device="cpu")
            else:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(bundled_model_path()), device="cpu")
        path = folder / f"{name}.onnx"
        t0 = time.perf_counter()
        (export_scoring if cross_encoder else export_embedding)(model, path, eager=name == "eager")
        out[name] = (path, time.perf_counter() - t0)
    return out


def _feeds(names: list[str], batch: int, length: int, rng) -> dict[str, np.ndarray]:
    feeds = {"input_ids": rng.integers(1000, 20000, (batch, length)),
             "attention_mask": np.ones((batch, length), dtype=np.int64)}
    if "token_type_ids" in names:
        types = np.zeros((batch, length), dtype=np.int64)
        types[:, min(20, length - 1):] = 1  # a 20-token query, then the document
        feeds["token_type_ids"] = types
    return feeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", default="sdpa,eager", help="A,B: two of sdpa, eager, built (default sdpa,eager)")
    p.add_argument("--cross-encoder", default=None, help="a cross-encoder folder (default: the bundled bi-encoder)")
    p.add_argument("--precision", choices=("bf16", "f32"), default="bf16")
    p.add_argument("--shapes", default=None, help="BATCHxLENGTH,... (default: 32x256,16x128,1x16; 10x128,1x128 "
                                                  "for a cross-encoder)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results/attention-export.json")
    args = p.parse_args(argv)
    ways = args.graphs.split(",")
    if len(ways) != 2 or len(set(ways)) != 2 or not set(ways) <= {"sdpa", "eager", "built"}:
        p.error("--graphs: two different ways of sdpa, eager, built")
    a, b = ways

    import openvino as ov

    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.platform import this_platform

    shapes = args.shapes or ("10x128,1x128" if args.cross_encoder else "32x256,16x128,1x16")
    rng = np.random.default_rng(0)
    core = ov.Core()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        made = _graphs(ways, args.cross_encoder, Path(tmp))
        compiled = {n: core.compile_model(str(path), "CPU", {
            "INFERENCE_PRECISION_HINT": args.precision, "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": args.threads})
            for n, (path, _) in made.items()}
        for shape in shapes.split(","):
            batch, length = (int(x) for x in shape.lower().split("x"))
            requests = {n: c.create_infer_request() for n, c in compiled.items()}
            feeds = _feeds([i.any_name for i in compiled[a].inputs], batch, length, rng)
            for r in requests.values():
                for _ in range(3):
                    r.infer(feeds)  # compiled for this shape and warm before timing
            seconds: dict[str, list[float]] = {n: [] for n in requests}
            rounds = args.rounds * (10 if batch * length <= 256 else 1)  # short calls: more of them
            for _ in range(rounds):
                for n, r in requests.items():
                    t0 = time.perf_counter()
                    r.infer(feeds)
                    seconds[n].append(time.perf_counter() - t0)
            outputs = {n: r.get_output_tensor(0).data.copy() for n, r in requests.items()}
            row = {"shape": [batch, length], "calls": rounds,
                   "max_abs_diff": float(np.abs(outputs[a].reshape(-1) - outputs[b].reshape(-1)).max())}
            for n, s in seconds.items():
                row[n] = {"median_ms": 1e3 * float(np.median(s)), "min_ms": 1e3 * float(np.min(s))}
            row["speedup_median"] = row[a]["median_ms"] / row[b]["median_ms"]
            rows.append(row)
            print(f"{batch:>3} x {length:<4} {a} {row[a]['median_ms']:8.2f} ms (min {row[a]['min_ms']:.2f})"
                  f"  {b} {row[b]['median_ms']:8.2f} ms (min {row[b]['min_ms']:.2f})"
                  f"  {row['speedup_median']:.2f}x  max |diff| {row['max_abs_diff']:.2g}")
    result = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "model": args.cross_encoder or "bundled all-MiniLM-L6-v2", "precision": args.precision,
              "graphs": ways, "make_seconds": {n: sec for n, (_, sec) in made.items()},
              "threads": args.threads, "machine": platform.machine(),
              "cpu": this_platform().to_dict(),
              "versions": versions(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
