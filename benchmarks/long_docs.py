"""Long documents: truncation against passages, on a long-document variant of SciFact.

SciFact's abstracts fit the encoder, so this builds a variant where they do not: every SciFact document is set
at a random offset inside unrelated text (documents of NPL, CISI, Cranfield and ADI: physics, information
science, aeronautics), its title moved inline with its abstract, the long document untitled; the qrels are kept.
Then ``retr eval`` scores, on the same queries:

- ``short``: SciFact itself (what the originals get; the recovery goal's denominator);
- ``long``: the long variant indexed as today (each document cut at the encoder's max length);
- ``long+passages N:S``: the long variant indexed as passages, documents ranked by MaxP (FirstP and sum from the
  same index, at search time).

The passage size is chosen on SciFact's dev split (20% of train queries, seed 42), then reported on test.
Results: benchmarks/results/long-docs.json. Run: ``python benchmarks/long_docs.py`` (about 40 min on 2 cores,
most of it encoding the passages; the indexes are cached in retr's cache for the next run).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "datasets"
FILLER_SOURCES = ("npl", "cisi", "cranfield", "adi")
PASSAGE_CANDIDATES = ("128:64", "224:112")
PIPELINES = ("bm25", "dense", "hybrid")
BUILT: dict[tuple[str, str | None], float] = {}  # (dataset, passages) -> encode seconds of the run that built it


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def make_long(src: Path, fillers: list[Path], out: Path, seed: int, min_words: int, max_words: int) -> Path:
    """Write the long variant of the BEIR folder ``src`` into ``out`` (splits ``dev``, ``train-rest``, ``test``)."""
    from retr.eval.data import load_dataset
    from retr.train.data import split_dev

    if (out / "corpus.jsonl").is_file():
        return out
    rng = random.Random(seed)
    pool = [f"{d.get('title', '')} {d.get('text', '')}".strip() for f in fillers for d in _read_jsonl(f / "corpus.jsonl")]
    pool = [p for p in pool if len(p.split()) >= 5]
    rng.shuffle(pool)
    stream = iter(pool * 64)

    def filler(words: int) -> list[str]:
        got, n = [], 0
        while n < words:
            piece = next(stream)
            got.append(piece)
            n += len(piece.split())
        return got

    tmp = out.with_name(out.name + ".tmp")
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    with (tmp / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for d in _read_jsonl(src / "corpus.jsonl"):
            total = rng.randint(min_words, max_words)
            before = int(total * rng.random())
            own = f"{d.get('title', '').strip()}. {d.get('text', '').strip()}".strip(". ")
            text = "\n\n".join([*filler(before), own, *filler(total - before)])
            fh.write(json.dumps({"_id": d["_id"], "title": "", "text": text}) + "\n")
    (tmp / "queries.jsonl").write_bytes((src / "queries.jsonl").read_bytes())
    (tmp / "qrels" / "test.tsv").write_bytes((src / "qrels" / "test.tsv").read_bytes())
    train = load_dataset(str(src), "train", download=False).qrels
    _, dev = split_dev(train, 0.2, 42)
    with (tmp / "qrels" / "dev.tsv").open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q in dev:
            for doc, grade in sorted(train[q].items()):
                fh.write(f"{q}\t{doc}\t{grade}\n")
    tmp.rename(out)
    return out


def evaluate(folder: Path, split: str, passages: str | None, aggregate: str | None = None) -> dict:
    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval
    from retr.retrieval.passages import PassageConfig
    from retr.retrieval.pipeline import PipelineConfig, parse_pipelines

    cfg = EvalConfig(pipelines=parse_pipelines(",".join(PIPELINES)),
                     passages=PassageConfig.parse(passages) if passages else None,
                     pipeline=PipelineConfig(passage_aggregate=aggregate))
    t0 = time.perf_counter()
    report = run_eval(load_dataset(str(folder), split, download=False), cfg)
    dense = report.index["manifest"]["dense"]
    if not dense["encode"]["cached"]:
        BUILT[(str(folder), passages)] = dense["encode"]["encode_seconds"]
    return {
        "ndcg@10": {p: r.metrics["NDCG@10"] for p, r in report.pipelines.items()},
        "recall@100": {p: r.metrics["Recall@100"] for p, r in report.pipelines.items()},
        "p50_ms": {p: r.latency_ms["total"].p50 for p, r in report.pipelines.items()},
        "vectors": (dense.get("passages") or {}).get("count", report.index["manifest"]["num_docs"]),
        "index_bytes": dense["bytes"], "encode_seconds": BUILT.get((str(folder), passages)),
        "index_cached": dense["encode"]["cached"], "truncation": dense.get("truncation"),
        "eval_seconds": time.perf_counter() - t0,
    }


def _seconds(value: float | None) -> str:
    return "cached" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "retr" / "long-docs"))
    ap.add_argument("--min-words", type=int, default=500, help="unrelated words around each document, at least")
    ap.add_argument("--max-words", type=int, default=900)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--candidates", default=",".join(PASSAGE_CANDIDATES))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "long-docs.json"))
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data = Path(args.data)
    long_dir = make_long(data / "scifact", [data / s for s in FILLER_SOURCES],
                         Path(args.work) / f"scifact-long-{args.seed}-{args.min_words}-{args.max_words}", args.seed,
                         args.min_words, args.max_words)
    results: dict = {"dataset": str(long_dir), "words_around": [args.min_words, args.max_words], "seed": args.seed}
    candidates = [c for c in args.candidates.split(",") if c]
    dev = {c: evaluate(long_dir, "dev", c) for c in candidates}
    chosen = max(candidates, key=lambda c: dev[c]["ndcg@10"]["hybrid"])
    results["dev"] = dev
    results["chosen_on_dev"] = chosen
    test = {"short": evaluate(data / "scifact", "test", None), "long": evaluate(long_dir, "test", None)}
    for c in candidates:
        test[f"long+passages {c}"] = evaluate(long_dir, "test", c)
    for agg in ("firstp", "sum"):
        test[f"long+passages {chosen} {agg}"] = evaluate(long_dir, "test", chosen, agg)
    results["test"] = test
    short = test["short"]["ndcg@10"]
    results["recovery"] = {name: {p: r["ndcg@10"][p] / short[p] for p in PIPELINES} for name, r in test.items()}
    from common import write_result

    write_result(args.out, results, say=False)
    print(f"chosen on dev (hybrid nDCG@10): {chosen}  " + "  ".join(f"{c}: {dev[c]['ndcg@10']['hybrid']:.4f}" for c in candidates))
    print(f"{'SciFact test':34}" + "".join(f"{p + ' nDCG@10':>16}{'recovery':>10}" for p in PIPELINES)
          + f"{'vectors':>9}{'encode s':>10}{'dense p50':>11}")
    for name, r in test.items():
        rec = results["recovery"][name]
        print(f"{name:34}" + "".join(f"{r['ndcg@10'][p]:>16.4f}{rec[p]:>10.1%}" for p in PIPELINES)
              + f"{r['vectors']:>9}{_seconds(r['encode_seconds']):>10}{r['p50_ms']['dense']:>9.1f}ms")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
