"""Batch search throughput: retr's batch search (`retr search --topics`, ``Index.search_topics``) against a loop of
single searches over the same index, and against the peers' own batch paths, side by side in one run. A script,
not a test.

    python benchmarks/batch_search.py [--dataset ../shared/datasets/scifact] [--k 10] [--rounds 3]
                                      [--work /tmp/retr-batch-bench] [--out benchmarks/results/batch-search.json]

Every query of the dataset's queries.jsonl is searched (SciFact: 1,109) with k hits:
  BM25   retr batch (``Searcher.search_run``: BM25 over ``os.cpu_count()`` threads) | retr single-query loop |
         bm25s batch retrieval (``BM25.retrieve(n_threads=cpu_count)`` over the same bm25s index folder, the same
         tokenisation: ``bm25s.tokenize`` with the index's stemmer and stopwords)
  dense  retr batch (chunks of queries of one token length encoded together, FAISS searching a chunk's vectors
         together) | retr single-query loop | sentence-transformers ``encode(batch_size=64)`` + one FAISS
         batch search over the same flat index
Queries/s is the best of ``--rounds`` rounds (each after one warm-up pass); ratios are retr batch / other. The
agreement columns count the queries whose top-k ids (and scores) equal the single-query loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import command_line, cpu, table, write_result


def _queries(dataset: Path) -> dict[str, str]:
    from retr.eval.topics import read_topics

    return read_topics(dataset / "queries.jsonl")


def _index(dataset: Path, work: Path) -> Path:
    from retr.cli.main import main

    folder = work / f"{dataset.name}-flat"
    if not (folder / "manifest.json").is_file():
        work.mkdir(parents=True, exist_ok=True)
        if main(["index", "--corpus", str(dataset), "--out", str(folder)]) != 0:
            raise SystemExit("retr index failed")
    return folder


def _best(fn, rounds: int) -> tuple[float, object]:
    fn()  # warm-up
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _ids(run: dict) -> dict[str, list[str]]:
    return {q: [d for d, _ in hits] for q, hits in run.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets" / "scifact"))
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/retr-batch-bench")
    ap.add_argument("--out", default="benchmarks/results/batch-search.json")
    args = ap.parse_args()

    import bm25s
    import faiss
    import numpy as np

    from retr.indexes.searcher import Searcher
    from retr.retrieval.bm25 import BM25Config, _stemmer
    from retr.retrieval.request import SearchRequest

    dataset = Path(args.dataset)
    folder = _index(dataset, Path(args.work))
    topics = _queries(dataset)
    ids, texts = list(topics), list(topics.values())
    n, k = len(texts), args.k
    searcher = Searcher(folder)
    results: dict = {"cpu": cpu(), "command": command_line(), "dataset": dataset.name, "queries": n, "k": k,
                     "threads": {"cpu_count": os.cpu_count(), "faiss_omp": faiss.omp_get_max_threads()},
                     "load_average_before": os.getloadavg(), "rows": {}}
    rows = []
    try:
        for mode in ("bm25", "dense"):
            request = SearchRequest.batch(texts, k=k, mode=mode)

            def batch(request=request):
                run = searcher.search_run(request, ids)
                return {q: [(h.doc_id, h.score) for h in hits] for q, hits in run.items()}

            def single(mode=mode):
                return {q: [(h.id, h.score) for h in searcher.search(t, k=k, mode=mode).hits]
                        for q, t in topics.items()}

            t_batch, run_batch = _best(batch, args.rounds)
            t_single, run_single = _best(single, args.rounds)
            if mode == "bm25":
                peer_name = "bm25s batch retrieve"
                cfg = BM25Config(**json.loads((folder / "bm25" / "retr_bm25.json").read_text()))
                model = bm25s.BM25.load(str(folder / "bm25"), mmap=True)
                doc_ids = searcher.index.ids

                def peer(model=model, cfg=cfg, doc_ids=doc_ids):
                    tok = bm25s.tokenize(texts, stopwords=cfg.stopwords or [], stemmer=_stemmer(cfg.stemmer),
                                         return_ids=False, show_progress=False)
                    known = [[t for t in q if t in model.vocab_dict] for q in tok]
                    asked = [i for i, q in enumerate(known) if q]  # bm25s refuses a query with no known term
                    docs, scores = model.retrieve([known[i] for i in asked], k=k, n_threads=os.cpu_count(),
                                                  show_progress=False)
                    out = {q: [] for q in ids}
                    for row, i in enumerate(asked):
                        out[ids[i]] = [(doc_ids[d], float(s)) for d, s in zip(docs[row], scores[row], strict=True)
                                       if s > 0]
                    return out
            else:
                from sentence_transformers import SentenceTransformer

                peer_name = "sentence-transformers + FAISS batch"
                st = SentenceTransformer(searcher.encoder.ref.path, device="cpu")  # the model that built the index
                index = searcher.index.faiss_index
                doc_ids = searcher.index.ids

                def peer(st=st, index=index, doc_ids=doc_ids):
                    q = st.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
                    scores, rows_ = index.search(np.ascontiguousarray(q, dtype=np.float32), k)
                    return {qid: [(doc_ids[d], float(s)) for d, s in zip(rows_[i], scores[i], strict=True) if d >= 0]
                            for i, qid in enumerate(ids)}
            t_peer, run_peer = _best(peer, args.rounds)
            same_ids = sum(_ids(run_batch)[q] == _ids(run_single)[q] for q in ids)
            same_all = sum(run_batch[q] == run_single[q] for q in ids)
            peer_ids = sum(_ids(run_peer)[q] == _ids(run_single)[q] for q in ids)
            qps = {"retr batch": n / t_batch, "retr single loop": n / t_single, peer_name: n / t_peer}
            results["rows"][mode] = {"qps": qps, "batch_equals_single_ids": same_ids,
                                     "batch_equals_single_ids_and_scores": same_all, "peer_equals_single_ids": peer_ids}
            rows.append([mode, qps["retr batch"], qps["retr single loop"], qps[peer_name], peer_name,
                         qps["retr batch"] / qps["retr single loop"], qps["retr batch"] / qps[peer_name],
                         f"{same_all}/{n}", f"{peer_ids}/{n}"])
    finally:
        searcher.close()
    results["load_average_after"] = os.getloadavg()  # other work on the machine while it ran (1, 5, 15 min)
    print(table(f"batch search, {dataset.name}: {n} queries, k={k}; best of {args.rounds} rounds; {results['cpu']}; "
                f"load average {results['load_average_before'][0]:.1f} before, "
                f"{results['load_average_after'][0]:.1f} after",
                ["mode", "retr batch q/s", "retr loop q/s", "peer q/s", "peer", "batch/loop", "batch/peer",
                 "batch==loop", "peer ids==loop"], rows))
    write_result(args.out, results)


if __name__ == "__main__":
    main()
