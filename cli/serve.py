"""`retr serve`: the index folder over HTTP (FastAPI + uvicorn), loopback by default."""

from __future__ import annotations

import argparse

from retr.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an index folder over HTTP: /search, a search page, /metrics")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--reranker", default=None, help="cross-encoder folder for requests with rerank=true")
    options.add_rerank_args(p)
    options.add_fusion_arg(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    options.add_backend_arg(p)
    options.add_query_backend_arg(p)
    options.add_query_prompt_arg(p)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take")
    p.add_argument("--max-batch", type=options.positive_int, default=64, help="queries per request")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from retr.retrieval.errors import RetrError

    try:
        import uvicorn  # noqa: F401 - checked here, for the message below

        from retr.cli.serve_app import ServeConfig, uvicorn_server
    except ImportError as e:
        raise RetrError(f"retr serve needs fastapi and uvicorn ({e.name} is missing): "
                        f"pip install 'retr[serve]'") from None

    cfg = ServeConfig(encoder=options.query_encoder_config(args),
                      pipeline=options.pipeline_config(args), rerank=options.rerank_config(args, args.reranker),
                      timeout_s=args.timeout, max_batch=args.max_batch)
    uvicorn_server(args.index, cfg, host=args.host, port=args.port).run()
    return 0
