"""Which int8 graphs keep SciFact's nDCG@10, judged through retr's own dense and hybrid pipelines: an index built
by retr (its documents through the static int8 graph), then either its queries or all its documents put through
another graph of the same model.

    python benchmarks/int8_graph_variants.py INDEX_FOLDER --side queries|documents [--variants fp32,static,...]
        [--dataset ../shared/datasets/scifact] [--out FILE]

INDEX_FOLDER: a SciFact index `retr eval --dataset scifact` or `retr index` built (its graphs in $RETR_CACHE).
Variants: ``fp32`` (the base OpenVINO graph), ``static`` (the calibrated static int8 graph in the cache), and
``wc-<MODE>-<GROUP>`` (the base graph with its MatMul weights compressed to int8 by ``nncf.compress_weights``,
MODE ``sym`` or ``asym``, activations quantised at run time in groups of GROUP, or ``-`` for OpenVINO's default),
``int8w-<GROUP>`` (retr's own int8-weights graph, ``export.compress_int8_weights``, activations in groups of GROUP;
0: not quantised, the weights dequantised to fp32).
``--side queries``: documents as the index holds them, each query through the variant as one stream of all threads
(a lone query's shape); ``--side documents``: every document encoded again through the variant (two streams),
queries through the fp32 graph. Prints nDCG@10 per pipeline, the encoding's seconds (documents) or the median
encode time per query (queries).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, write_result  # noqa: E402


def runner_for(variant: str, base, calibrated_path: Path | None, streams: int | None):
    """An OpenVINO runner of ``variant`` (see the module's docstring) on the base graph's threads, and the seconds
    its weights took to compress (None: nothing compressed)."""
    import openvino as ov

    from retr.retrieval.backends.runners import OpenVinoRunner

    class GroupedRunner(OpenVinoRunner):
        """retr's runner, compiled with OpenVINO's run-time activation quantisation in groups of ``group``."""
        group: int | None = None

        def compile_config(self) -> dict:
            extra = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": self.group} if self.group is not None else {}
            return {**super().compile_config(), **extra}

    threads = base.runner._threads
    if variant == "fp32":
        return OpenVinoRunner(base.path, threads, "fp32", streams=streams), None
    if variant == "static":
        if calibrated_path is None:
            raise SystemExit("no calibrated graph in $RETR_CACHE for this model: build the index there first")
        return OpenVinoRunner(calibrated_path, threads, "fp32", streams=streams), None
    if variant.startswith("int8w-"):  # retr's own int8-weights graph (export.compress_int8_weights), any group
        import tempfile

        from retr.retrieval.backends.export import compress_int8_weights

        t0 = time.perf_counter()
        path = Path(tempfile.mkdtemp(prefix="retr-int8w-")) / "model.xml"
        compress_int8_weights(ov.Core().read_model(str(base.path)), path, None)
        runner = GroupedRunner(path, threads, "fp32", streams=streams)
        runner.group = int(variant.split("-", 1)[1])
        return runner, time.perf_counter() - t0
    _, mode, group = variant.split("-", 2)
    import nncf

    t0 = time.perf_counter()
    model = nncf.compress_weights(ov.Core().read_model(str(base.path)),
                                  mode={"sym": nncf.CompressWeightsMode.INT8_SYM,
                                        "asym": nncf.CompressWeightsMode.INT8_ASYM}[mode])
    compress_s = time.perf_counter() - t0
    runner = GroupedRunner(base.path, threads, "fp32", streams=streams, model=model)
    runner.group = None if group == "-" else int(group)
    return runner, compress_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("--side", choices=["queries", "documents"], required=True)
    ap.add_argument("--variants", default="fp32,static,wc-sym-64,wc-asym--")
    ap.add_argument("--dataset", default="../shared/datasets/scifact")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import faiss

    from retr.eval.data import load_dataset
    from retr.eval.metrics import evaluate
    from retr.eval.runner import run_pipeline
    from retr.indexes.shards import open_index
    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.batching import run_sorted
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.compose import IndexParts, build
    from retr.retrieval.dense import DenseRetriever
    from retr.retrieval.fuse import FusedRetriever
    from retr.retrieval.pipeline import parse

    ds = load_dataset(args.dataset, "test", download=False)
    parts = IndexParts(open_index(args.index))
    enc = parts.encoder
    base = enc.graph
    calibrated = enc.exported.find(enc.config.backend, enc.planner.calibration)
    rows = enc.tokens.ids([enc.prompts.document + d.full_text() for d in ds.corpus.docs]) \
        if args.side == "documents" else None
    results = {}
    for variant in args.variants.split(","):
        runner, compress_s = runner_for(variant, base, calibrated.path if calibrated else None,
                                        streams=1 if args.side == "queries" else None)
        row = {"compress_s": compress_s}
        made = {p: build(parse(p), parts) for p in ("dense", "hybrid")}
        if args.side == "queries":
            enc.query_graphs.__dict__["graph"] = replace(base, runner=runner)
        else:
            out = np.empty((len(rows), enc.dim), dtype=np.float32)
            t0 = time.perf_counter()
            run_sorted(runner, rows, enc.config.token_budget, out, parts=runner.parallel)
            row["encode_s"] = time.perf_counter() - t0
            index = faiss.IndexFlatIP(enc.dim)
            index.add(out)
            dense = DenseRetriever(index, ds.corpus.ids, enc)
            made = {"dense": dense, "hybrid": FusedRetriever([parts.bm25(), dense], name="hybrid")}
        for pipeline in ("dense", "hybrid"):
            run, timings = run_pipeline(made[pipeline], ds.queries, 1000, warmup=5)
            row[f"{pipeline}_ndcg10"] = evaluate(run, ds.qrels, k_values=[10]).mean["NDCG@10"]
            if args.side == "queries":
                row[f"{pipeline}_encode_p50_ms"] = float(np.median([t["encode"] for t in timings.values()])) * 1000
        results[variant] = row
        print(variant, {k: round(v, 4) for k, v in row.items() if v is not None}, flush=True)
    if args.out:
        write_result(args.out, {"header": {"command": command_line(), "versions": versions(),
                                           "cpu": this_platform().to_dict(),
                                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                "side": args.side, "queries": len(ds.queries), "variants": results})


if __name__ == "__main__":
    main()
