"""How a graph's attention is exported, timed: the same model exported twice by retr's exporter, once with
torch's SDPA attention as the model loads (TorchScript decomposes it: masking through IsNaN/Select) and once with
eager attention (retr's export since generation 3: ``export.eager_attention``; OpenVINO fuses it), both run by
OpenVINO on one stream at the given precision, alternating call by call so that drift on a shared machine falls
on both; median and minimum per shape, and the largest difference between the two graphs' outputs.

    python benchmarks/attention_export.py [--cross-encoder DIR] [--precision bf16|f32] [--rounds 20]
        [--shapes 32x256,16x128,1x16] [--threads 1] --out benchmarks/results/attention-export.json

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


def _graphs(cross_encoder: str | None, folder: Path) -> dict[str, Path]:
    from retr.retrieval.backends.export import export_embedding, export_scoring

    out = {}
    for name, eager in (("sdpa", False), ("eager", True)):
        path = folder / f"{name}.onnx"
        if cross_encoder:
            from sentence_transformers import CrossEncoder

            export_scoring(CrossEncoder(cross_encoder, device="cpu"), path, eager=eager)
        else:
            from sentence_transformers import SentenceTransformer

            from retr.retrieval.models import bundled_model_path

            export_embedding(SentenceTransformer(str(bundled_model_path()), device="cpu"), path, eager=eager)
        out[name] = path
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
    p.add_argument("--cross-encoder", default=None, help="a cross-encoder folder (default: the bundled bi-encoder)")
    p.add_argument("--precision", choices=("bf16", "f32"), default="bf16")
    p.add_argument("--shapes", default=None, help="BATCHxLENGTH,... (default: 32x256,16x128,1x16; 10x128,1x128 "
                                                  "for a cross-encoder)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results/attention-export.json")
    args = p.parse_args(argv)

    import openvino as ov

    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends import runners

    shapes = args.shapes or ("10x128,1x128" if args.cross_encoder else "32x256,16x128,1x16")
    rng = np.random.default_rng(0)
    core = ov.Core()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = _graphs(args.cross_encoder, Path(tmp))
        compiled = {n: core.compile_model(str(path), "CPU", {
            "INFERENCE_PRECISION_HINT": args.precision, "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": args.threads})
            for n, path in paths.items()}
        for shape in shapes.split(","):
            batch, length = (int(x) for x in shape.lower().split("x"))
            requests = {n: c.create_infer_request() for n, c in compiled.items()}
            feeds = _feeds([i.any_name for i in compiled["sdpa"].inputs], batch, length, rng)
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
                   "max_abs_diff": float(np.abs(outputs["sdpa"] - outputs["eager"]).max())}
            for n, s in seconds.items():
                row[n] = {"median_ms": 1e3 * float(np.median(s)), "min_ms": 1e3 * float(np.min(s))}
            row["speedup_median"] = row["sdpa"]["median_ms"] / row["eager"]["median_ms"]
            rows.append(row)
            print(f"{batch:>3} x {length:<4} sdpa {row['sdpa']['median_ms']:8.2f} ms (min {row['sdpa']['min_ms']:.2f})"
                  f"  eager {row['eager']['median_ms']:8.2f} ms (min {row['eager']['min_ms']:.2f})"
                  f"  {row['speedup_median']:.2f}x  max |diff| {row['max_abs_diff']:.2g}")
    result = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "model": args.cross_encoder or "bundled all-MiniLM-L6-v2", "precision": args.precision,
              "threads": args.threads, "machine": platform.machine(),
              "cpu_bf16": runners.cpu_has_bf16(), "cpu_int8_dot": runners.cpu_has_int8_dot(),
              "cpu_amx": runners.cpu_has_amx(),
              "versions": versions(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
