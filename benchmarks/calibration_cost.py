"""What static int8's calibration costs and what each of its steps buys: NNCF's quantisation of the bi-encoder's
base OpenVINO graph on retr's fixed sample, with and without SmoothQuant, fast bias correction and the full
sample, each timed and then judged on SciFact's dev split (20% of train, seed 42: tuning never sees test).

    python benchmarks/calibration_cost.py [--dataset ../shared/datasets/scifact] [--variants default,no-fbc,...]
        [--out benchmarks/results/calibration-cost.json]

Per variant: seconds in ``nncf.quantize`` (the same call as ``retr.retrieval.backends.export.quantize_static_int8``
but for the variant's settings), the documents' cosine to the base graph's vectors, the ranking noise the int8
documents add (``export.pair_noise`` of dev queries' scores), and nDCG@10 on the dev queries with documents and
queries through the int8 graph (queries one at a time, as a lone query runs) against the base graph's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, write_result  # noqa: E402

# name -> (skip SmoothQuant, skip fast bias correction, calibration rows kept (None: all))
VARIANTS = {
    "default": (False, False, None),
    "no-fbc": (False, True, None),
    "no-sq": (True, False, None),
    "half-sample": (False, False, 0.5),
    "no-fbc-half-sample": (False, True, 0.5),
    "no-sq-no-fbc": (True, True, None),
}


def quantize(model, feeds: list, skip_sq: bool, skip_fbc: bool):
    import nncf

    advanced = nncf.AdvancedQuantizationParameters(
        disable_bias_correction=skip_fbc,
        **({"smooth_quant_alphas": nncf.AdvancedSmoothQuantParameters(matmul=-1)} if skip_sq else {}))
    ignored = nncf.IgnoredScope(types=["NormalizeL2"], validate=False)  # as export.quantize_static_int8
    return nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                         preset=nncf.QuantizationPreset.MIXED, subset_size=len(feeds), ignored_scope=ignored,
                         advanced_parameters=advanced)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="../shared/datasets/scifact")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import openvino as ov

    from retr.eval.data import load_dataset
    from retr.eval.metrics import evaluate
    from retr.retrieval.backends.batching import run_sorted
    from retr.retrieval.backends.export import pair_noise
    from retr.retrieval.backends.runners import OpenVinoRunner
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.types import Hit, Run
    from retr.train.data import split_dev

    ds = load_dataset(args.dataset, "train", download=False)
    _, dev = split_dev(ds.qrels, 0.2, 42)
    dev = [q for q in dev if q in ds.queries]
    enc = BiEncoder(EncoderConfig())
    base = enc.graph
    docs = enc.tokens.ids([enc.prompts.document + d.full_text() for d in ds.corpus.docs])
    queries = enc.tokens.ids([enc.prompts.query + ds.queries[q] for q in dev])
    feeds = list(enc.planner.calibration.feeds())
    ids = ds.corpus.ids
    budget = enc.config.token_budget

    def encode(runner) -> tuple[np.ndarray, np.ndarray, float]:
        out = np.empty((len(docs), enc.dim), dtype=np.float32)
        t0 = time.perf_counter()
        run_sorted(runner, docs, budget, out, parts=runner.parallel)
        seconds = time.perf_counter() - t0
        single = runner.one_stream()
        q = np.concatenate([single({"input_ids": np.asarray([r], dtype=np.int64),
                                    "attention_mask": np.ones((1, len(r)), np.int64)}) for r in queries])
        return out, q, seconds

    def ndcg(d: np.ndarray, q: np.ndarray) -> float:
        scores = q @ d.T
        top = np.argsort(-scores, axis=1)[:, :10]
        run = Run({qid: [Hit(ids[j], float(scores[i, j])) for j in top[i]] for i, qid in enumerate(dev)})
        return evaluate(run, ds.qrels, k_values=[10]).mean["NDCG@10"]

    base_docs, base_q, base_s = encode(base.runner)
    rows = {"base": {"backend": base.variant, "precision": base.precision, "encode_s": base_s,
                     "dev_ndcg10": ndcg(base_docs, base_q)}}
    print(f"base {base.variant} ({base.precision}): encode {base_s:.1f} s, dev nDCG@10 "
          f"{rows['base']['dev_ndcg10']:.4f}", flush=True)
    base_model = ov.Core().read_model(str(base.path))
    tmp = Path(tempfile.mkdtemp())
    for name in args.variants.split(","):
        skip_sq, skip_fbc, fraction = VARIANTS[name]
        used = feeds[::int(round(1 / fraction))] if fraction else feeds
        t0 = time.perf_counter()
        q_model = quantize(base_model.clone(), used, skip_sq, skip_fbc)
        q_s = time.perf_counter() - t0
        ov.save_model(q_model, str(tmp / f"{name}.xml"), compress_to_fp16=False)
        runner = OpenVinoRunner(tmp / f"{name}.xml", threads=base.runner._threads)
        d, q, s = encode(runner)
        cos = (d * base_docs).sum(1)
        rows[name] = {"skip_smooth_quant": skip_sq, "skip_fast_bias_correction": skip_fbc, "sample_rows": len(used),
                      "quantize_s": q_s, "encode_s": s, "doc_cosine_mean": float(cos.mean()),
                      "doc_cosine_min": float(cos.min()), "query_cosine_mean": float((q * base_q).sum(1).mean()),
                      "rank_noise": pair_noise(base_q @ base_docs.T, q @ d.T), "dev_ndcg10": ndcg(d, q)}
        r = rows[name]
        print(f"{name}: quantize {q_s:.1f} s ({len(used)} rows), encode {s:.1f} s, doc cosine {r['doc_cosine_mean']:.5f}"
              f" (min {r['doc_cosine_min']:.4f}), rank noise {r['rank_noise']:.4f}, dev nDCG@10 {r['dev_ndcg10']:.4f} "
              f"({r['dev_ndcg10'] - rows['base']['dev_ndcg10']:+.4f})", flush=True)
        del runner
    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.platform import this_platform

    result = {"header": {"command": command_line(), "versions": versions(), "cpu": this_platform().to_dict(),
                         "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              "dev_queries": len(dev), "docs": len(docs), "variants": rows}
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
