"""`retr doctor --rerank MODEL`: the cross-encoder's candidate graphs timed here on one query's pairs at the rerank
depth, their ranking noise against the configured graph, and what is chosen and why."""

from __future__ import annotations

import argparse
import time

from retr.cli import options


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank", default=None, metavar="MODEL",
                   help="also time a cross-encoder's graphs (folder or hub id) on one query's pairs at "
                        "--rerank-depth; with --export, every graph this machine can run is made first (default: none)")
    p.add_argument("--rerank-depth", type=options.positive_int, default=None,
                   help="pairs per query the cross-encoder's graphs are timed on (default: the rerank depth)")


def candidates() -> tuple[list, list[tuple[str, str]]]:
    """The cross-encoder backends this machine can run, and why each other one cannot (``chooser.prune``)."""
    from retr.retrieval.backends import chooser
    from retr.retrieval.backends.export import SCORING
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.backends.registry import BACKENDS

    return chooser.prune(this_platform(), [b for b in BACKENDS.values() if b.exported and b.supports(SCORING)])


def make_graphs(model: str, depth: int) -> tuple[dict[str, float], dict[str, str]]:
    """Make (export, calibrate, check) every cross-encoder graph of ``model`` this machine can run and that is not
    in the cache yet: the seconds each took, and why each refused one was refused."""
    from retr.retrieval.errors import RetrError
    from retr.retrieval.rerank_model import CrossEncoderReranker, RerankConfig

    made, refused = {}, {}
    for b in candidates()[0]:
        t0 = time.perf_counter()
        try:
            CrossEncoderReranker(RerankConfig(model=model, depth=depth, backend=b.name, corpus_check=False))
            made[b.name] = time.perf_counter() - t0
        except RetrError as e:  # disagrees with torch, or too noisy: not a candidate
            refused[b.name] = str(e)
    return made, refused


def timed_rows(graphs, choice, made) -> list[dict]:
    """Each of ``graphs.candidates`` (a ``GraphChoice``) as ``choice`` timed it, else timed now (no choice: the
    only candidate), with its ranking noise, its check and what making it cost (``made(name, graph)``)."""
    from retr.retrieval.backends.chooser import Timing

    timed = {t.backend: t for t in choice.timings} if choice is not None else {}
    rows = []
    for name, graph in graphs.candidates.items():
        t = timed.get(name) or Timing(name, graphs.seconds(graph))
        rows.append({"backend": name, "ms_per_query": t.ms, "rank_noise": t.rank_noise, "passed": t.passed,
                     **({"why": t.why} if t.why else {}), "made_seconds": made(name, graph)})
    return rows


def print_rows(rows: list[dict], width: str, bar: float | None = None) -> None:
    """``timed_rows`` as the doctor prints them: milliseconds (``width``: their format), what making each cost,
    its ranking noise and whether it passed (against ``bar``, where given)."""
    for c in rows:
        made = f"  made in {c['made_seconds']:.1f} s" if c.get("made_seconds") else ""
        noise = "" if c.get("rank_noise") is None else f"  ranking noise {c['rank_noise']:.4f} (" \
            + ("ok" if c["passed"] else "REFUSED") + (f", bar {bar}" if bar is not None else "") + ")"
        print(f"  {c['backend']:<18} {c['ms_per_query']:{width}}{made}{noise}")


def _configured(model: str, depth: int):
    """The cross-encoder on its configured graph (``DEFAULT_RERANK_BACKEND``): the reference the others are timed
    and checked against."""
    from retr.retrieval.backends.registry import DEFAULT_RERANK_BACKEND
    from retr.retrieval.rerank_model import CrossEncoderReranker, RerankConfig

    return CrossEncoderReranker(RerankConfig(model=model, depth=depth, backend=DEFAULT_RERANK_BACKEND,
                                             corpus_check=False))


def _time_now(base):
    """``base``'s candidates timed now and the choice stored (None: one graph only, or torch)."""
    if base.pair_graphs is None or len(base.pair_graphs.candidates) < 2:
        return None
    return base.pair_graphs.decide(again=True)


def choose_now(model: str, depth: int):
    """The choice among ``model``'s cached graphs at ``depth``, timed now and stored (None: one graph only)."""
    return _time_now(_configured(model, depth))


def report(args: argparse.Namespace) -> dict | None:
    """The cross-encoder section of the doctor's report (None without ``--rerank``)."""
    if not args.rerank:
        return None
    from retr.retrieval.rerank_model import DEFAULT_RERANK_DEPTH

    depth = args.rerank_depth or DEFAULT_RERANK_DEPTH
    kept, pruned = candidates()
    made, refused = make_graphs(args.rerank, depth) if args.export else ({}, {})
    base = _configured(args.rerank, depth)
    if base.pair_graphs is None:
        return {"model": args.rerank, "chosen": "torch", "why": "no exported graph here: torch scores"}
    choice = _time_now(base)
    rows = timed_rows(base.pair_graphs, choice, lambda name, graph: made.get(name))
    return {"model": args.rerank, "hash": base.model_hash, "depth": depth, "max_length": base.max_length,
            "candidates": rows, "chosen": choice.backend if choice else base.graph.variant,
            "why": choice.why if choice else "the only cross-encoder graph in the cache",
            "refused": [{"backend": n, "why": w} for n, w in refused.items()],
            "pruned": [{"backend": n, "why": w} for n, w in pruned],
            "not_in_cache": [b.name for b in kept if b.name not in base.pair_graphs.candidates
                             and b.name not in refused]}


def print_report(r: dict) -> None:
    if "candidates" not in r:
        print(f"cross-encoder {r['model']}: {r['why']}")
        return
    print(f"cross-encoder: {r['model']} ({r['hash'][:12]}), one query's {r['depth']} pairs at up to "
          f"{r['max_length']} tokens (ms):")
    print_rows(r["candidates"], "8.1f")
    print(f"  chosen: {r['chosen']} - {r['why']}")
    for x in r["refused"]:
        print(f"  refused when made: {x['backend']}: {x['why']}")
    if r["not_in_cache"]:
        print(f"  not timed (not in the cache; --export makes them): {', '.join(r['not_in_cache'])}")
