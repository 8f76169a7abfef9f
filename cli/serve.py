"""`retr serve`: the index folder over HTTP (FastAPI + uvicorn), loopback by default."""

from __future__ import annotations

import argparse
import math
import sys

from retr.cli import options


class ServeDefaults:
    """The defaults of ``retr.serve.config.ServeConfig`` that the options show (that module imports the search
    stack, so it is imported only when the server runs; tests/test_serve_safety.py checks that the two agree)."""
    timeout_s = 30.0
    max_connections = 128
    max_batch = 64


def port(text: str) -> int:
    """A TCP port: an integer from 0 (a free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: 0-65535 (0: a free one)")
    return value


def seconds(text: str) -> float:
    """A duration in seconds: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an index folder over HTTP: /search, a search page, /metrics")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, loopback only; any other is warned about)")
    p.add_argument("--port", type=port, default=8000, help="TCP port to listen on, 0-65535 (0: a free one, said in "
                   "the startup line)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name to answer besides the loopback ones (localhost, 127.0.0.1, ::1); repeatable. "
                        "Any other Host gets 400 (DNS rebinding)")
    options.add_search_options(p, "serve")
    options.add_rerank_args(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    options.add_backend_arg(p)
    options.add_query_backend_arg(p)
    options.add_query_prompt_arg(p)
    p.add_argument("--timeout", type=seconds, default=ServeDefaults.timeout_s,
                   help="seconds a search may take, and a request may take to arrive (headers and body; a stalled "
                        "client is answered 408 and closed)")
    p.add_argument("--max-connections", type=options.positive_int, default=ServeDefaults.max_connections,
                   help="open connections at once; one more is answered 503 and closed")
    p.add_argument("--max-batch", type=options.positive_int, default=ServeDefaults.max_batch,
                   help="queries per request")
    p.set_defaults(run=run)


SERVE_PACKAGES = ("fastapi", "uvicorn", "httptools", "orjson")  # the `serve` extra (the guarded protocol is httptools')


def missing_packages() -> list[str]:
    """The packages of the `serve` extra that are not installed, all of them."""
    import importlib.util

    return [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    from retr.retrieval.errors import RetrError

    missing = missing_packages()
    if missing:
        raise RetrError(f"retr serve needs fastapi, uvicorn, httptools and orjson ({', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} missing): pip install 'retr[serve]'")
    from retr.serve.app import uvicorn_server
    from retr.serve.config import ServeConfig, is_loopback

    cfg = ServeConfig(encoder=options.query_encoder_config(args),
                      pipeline=options.pipeline_config(args), rerank=options.rerank_config(args, args.rerank),
                      timeout_s=args.timeout, max_batch=args.max_batch, max_connections=args.max_connections,
                      allowed_hosts=tuple(args.allow_host))
    if not is_loopback(args.host):
        print(f"retr serve: warning: listening on {args.host}, not loopback: other machines can reach this server, "
              f"which has no authentication; every document in {args.index} can be read through it",
              file=sys.stderr, flush=True)
    checked = check_reranker(args.index, cfg)
    if checked:
        print(f"retr serve: {checked}", file=sys.stderr, flush=True)
    server = uvicorn_server(args.index, cfg, host=args.host, port=args.port,
                            announce=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        server.run()
    except SystemExit:  # uvicorn's exit when it cannot listen, after logging why
        pass
    if not server.started:
        raise RetrError(f"could not listen on {args.host}:{args.port} (the port is taken, or the address is not "
                        f"this machine's)")
    return 0


def check_reranker(index: str, cfg) -> str | None:
    """The server's cross-encoder checked on the index's corpus where that applies, once, before the server opens
    it: the step of `retr check-reranker` (a check stored beside the index or in the cache is read; one measured
    is stored beside the index, or, where it cannot be, in the cache with a warning). The server's searcher then
    reads the stored check, as every searcher does. Returns the line that says the weight it gets."""
    if cfg.rerank is None:
        return None
    from retr.cli.check_reranker import check_and_store

    return check_and_store(index, cfg.rerank.model, cfg.pipeline, cfg.rerank, cfg.encoder, strict=False)
