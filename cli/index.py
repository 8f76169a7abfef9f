"""`retr index`: embed a corpus into an index folder (+ BM25)."""

from __future__ import annotations

import argparse

from retr.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser("index", help="embed a corpus into a FAISS index folder (+ BM25)")
    p.add_argument("--corpus", required=True, help="BEIR folder or corpus file (.jsonl, .csv, .tsv)")
    p.add_argument("--out", required=True,
                   help="index folder to write (an existing retr index there is replaced atomically; "
                        "anything else is refused)")
    p.add_argument("--bm25", action=argparse.BooleanOptionalAction, default=True,
                   help="build the BM25 part beside the dense one (--no-bm25: dense only)")
    p.add_argument("--id-field", default=None,
                   help="the field holding a document's id (default: detected: _id, id, docid, doc_id)")
    p.add_argument("--text-field", default=None,
                   help="the field holding a document's text (default: detected: text, contents, body, abstract)")
    p.add_argument("--title-field", default=None,
                   help="the field holding a document's title (default: 'title' where present; '' for none)")
    options.add_model_args(p)
    options.add_index_args(p)
    options.add_bm25_args(p)
    options.add_passage_args(p)
    options.add_sparse_model_arg(p)
    p.add_argument("--check-reranker", default=None, metavar="MODEL_DIR",
                   help="cross-encoder: once the index is built, check it on the corpus as `retr check-reranker` "
                        "does and store the check beside the index (default: none)")
    options.add_rerank_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.indexes.build import IndexConfig, build_index
    from retr.indexes.corpus import CorpusFormat, load_corpus

    if args.check_reranker:  # a cross-encoder that cannot be read is refused before anything is built
        from retr.retrieval.rerank import cross_encoder_ref

        cross_encoder_ref(args.check_reranker)
    corpus = load_corpus(Path(args.corpus), CorpusFormat(args.id_field, args.text_field, args.title_field))
    cfg = IndexConfig(dense=options.dense_config(args), encoder=options.encoder_config(args),
                      bm25=options.bm25_config(args) if args.bm25 else None, use_cache=not args.no_cache,
                      passages=options.passage_config(args), shards=args.shards,
                      executor=options.executor_config(args), sparse=options.sparse_config(args))
    m = build_index(corpus, Path(args.out), cfg)
    d = m["dense"]
    parts = f" as {d['passages']['count']} passages" if d.get("passages") else ""
    parts += f" in {len(m['shards'])} shards" if m.get("shards") else ""
    print(f"indexed {m['num_docs']} documents{parts} into {args.out}: {d['kind']} {d['dim']}-d ({d['model']['id']}), "
          f"{d['docs_per_second']:.1f} docs/s{', + bm25' if m['bm25'] else ''}"
          f"{', + sparse (' + m['sparse']['model']['kind'] + ')' if m.get('sparse') else ''}"
          f"{f', {corpus.empty_docs} empty' if corpus.empty_docs else ''}")
    if args.check_reranker:
        from retr.cli.check_reranker import check_and_store
        from retr.retrieval.pipeline import PipelineConfig

        model = args.check_reranker
        print(check_and_store(args.out, model, PipelineConfig(), options.rerank_config(args, model)))
    return 0
