"""What the reranker check would choose on a cross-encoder's own training corpus, where retr does not run it (the
weight chosen on that corpus's judged dev queries is used there): a look at how conservative the check is.

    python benchmarks/rerank_check_own.py --model BI --dataset ../shared/datasets/scifact CE [CE ...]
        --out benchmarks/results/rerank-check-scifact.json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rerankers", nargs="+", help="cross-encoder folders")
    p.add_argument("--model", required=True, help="the first stage's bi-encoder")
    p.add_argument("--dataset", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from common import command_line, write_result

    from retr.eval.data import load_dataset
    from retr.eval.pseudo import check_reranker
    from retr.retrieval.artifacts import versions
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    ds = load_dataset(args.dataset, "test", download=False)
    encoder = BiEncoder(EncoderConfig(model=args.model))
    result = {"command": command_line(), "versions": versions(), "dataset": ds.name, "model": args.model,
              "checks": {}}
    for name in args.rerankers:
        rr = CrossEncoderReranker(RerankConfig(model=name))
        check = check_reranker(ds.corpus, encoder, rr)
        result["checks"][name] = asdict(check) if check else None
        if check:
            print(name, check.weight, {k: round(v - check.curve["0.0"], 4) for k, v in check.curve.items()},
                  f"{check.seconds:.0f} s", flush=True)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
