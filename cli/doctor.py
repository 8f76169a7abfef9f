"""`retr doctor`: this machine as retr sees it. First a plain summary: the CPU's class, the graph documents and
queries go through, what a first run of 1,000 and of 100,000 documents costs here against what was measured on
that class, and one suggestion. With ``--verbose``, the detail behind it: each candidate graph's measured speed,
what is chosen and why, what was pruned and what is not in the cache."""

from __future__ import annotations

import argparse
import json

from retr.cli import doctor_rerank, options


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="this machine's CPU, the candidate graphs timed here, what is chosen and why, "
                                      "and what a first run costs")
    p.add_argument("--model", default=None, help="bi-encoder (default: the bundled all-MiniLM-L6-v2)")
    options.add_backend_arg(p)
    p.add_argument("--docs", type=options.positive_int, default=1000,
                   help="corpus size the first-run cost and the int8 calibration break-even are given for")
    p.add_argument("--doc-tokens", type=options.positive_int, default=200,
                   help="tokens per document (after truncation) the per-document speeds and the first-run cost are "
                        "given for (SciFact's documents: ~240 at 256; NPL's ~40)")
    p.add_argument("--export", action="store_true",
                   help="also make (export, calibrate) every candidate graph not yet in the cache, timing what "
                        "each costs, so that every candidate is timed (needs torch; slow)")
    doctor_rerank.add_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", dest="detail", action="store_true",
                   help="the detail after the summary: every candidate graph timed, the choices and the pruned")
    p.set_defaults(run=run)


SUMMARY_DOCS = (1_000, 100_000)
# the README's first command (`retr eval --dataset scifact`, 5,183 documents, empty cache, whole process) as
# measured on 2 cores of each CPU class: the README's table of first runs (docs/studies/measured-choices*.md)
CLASS_FIRST_RUN = {
    "AMX": ("a Xeon with AMX, 49-79 s (2026-12-06)", 79.0),
    "AVX-512 VNNI": ("an AVX-512 BF16/VNNI EPYC, 71-82 s (2026-12-07)", 82.0),
    "AVX2 only": ("an AVX2-only EPYC, 305 s on a quiet machine (2026-12-07)", 305.0),
}
SCIFACT_DOCS, SCIFACT_TOKENS = 5183, 240  # its documents, and their mean tokens at 256 (the encoding's work)


def cpu_class(p: dict) -> str:
    """The CPU class the README's first-run figures are given for."""
    if p.get("amx"):
        return "AMX"
    if p.get("int8_dot"):
        return "AVX-512 VNNI" if p.get("avx512") else "AVX-VNNI"
    if p.get("avx512"):
        return "AVX-512 without VNNI"
    return "AVX2 only" if p.get("avx2") else "no AVX2"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"


def _per_doc(runs: list[dict]) -> float:
    """Seconds per document of the largest first run (its graph's making spread thin)."""
    return runs[-1]["seconds"] / runs[-1]["docs"]


def _first_run_at(enc, backend, kept, costs: dict, docs: int, doc_tokens: int, base_s: float) -> dict:
    """What a first run of ``docs`` new documents of ``doc_tokens`` tokens costs here: the documents' graph made
    (where it was not before), int8 calibrated where it pays, and the encoding; as ``retr index`` would decide
    (``base_s``: seconds per document through the base graph, timed once)."""
    int8_here = backend.calibrated and backend in kept
    brk = enc.planner.weighing.calibration_break(docs, docs * doc_tokens) if int8_here else None
    build = costs.get(enc.graph.variant) or 0.0
    if brk is not None and brk.pays:
        calibrated = enc.exported.find(backend, enc.planner.calibration)
        calib = 0.0 if calibrated is not None else brk.calibration_s
        return {"docs": docs, "graph": backend.name, "seconds": build + calib + docs * brk.int8_s}
    if brk is not None and not brk.against_base:
        return {"docs": docs, "graph": brk.against, "seconds": build + docs * brk.base_s}
    return {"docs": docs, "graph": enc.graph.variant, "seconds": build + docs * base_s}


def _made_seconds(graph) -> float | None:
    """What making ``graph`` cost when it was made (its cache manifest's ``export_seconds``)."""
    try:
        return float(json.loads((graph.path.parent / "manifest.json").read_text())["export_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _report(args: argparse.Namespace) -> dict:
    import time
    from dataclasses import replace

    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.backends import chooser
    from retr.retrieval.backends.export import EMBEDDING
    from retr.retrieval.backends.plan import PlanStore
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.backends.registry import BACKENDS, base_of, get_backend
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    platform = this_platform()
    config = EncoderConfig(model=args.model, backend=args.backend)
    t0 = time.perf_counter()
    enc = BiEncoder(config)
    opened_s = time.perf_counter() - t0
    if enc.graph is None:
        return {"platform": platform.to_dict(), "model": enc.model_id, "backend": "torch",
                "why": "no exported graph here: torch encodes"}
    kept, pruned = chooser.prune(platform, [b for b in BACKENDS.values() if b.exported and b.supports(EMBEDDING)])
    costs = {enc.graph.variant: _made_seconds(enc.graph)}
    backend = get_backend(config.backend)
    if args.export:
        for b in kept:
            if b.calibrated or not b.queries or b.name == enc.graph.variant:  # documents' int8: the planner's
                continue
            t0 = time.perf_counter()
            if enc.exported.find(b) is None:
                replace(enc.exported, use_cache_alone=False).open(b.name)
                costs[b.name] = time.perf_counter() - t0
        if backend.calibrated and backend in kept:
            enc.planner.calibrated_graph  # noqa: B018 - calibrated (and cached) now, timed below
        enc = BiEncoder(config)  # sees every graph now in the cache
    queries = enc.query_graphs
    query_choice = queries.decide(again=True) if len(queries.candidates) > 1 else None
    query_rows = doctor_rerank.timed_rows(queries, query_choice, lambda name, g: costs.get(name) or _made_seconds(g))
    int8_here = backend.calibrated and backend in kept
    calibrated = enc.exported.find(backend, enc.planner.calibration) if int8_here else None
    # what `retr index` decides a corpus of --docs documents by (``Weighing.calibration_break``): its timings
    # stored, so that what doctor shows is what an index reads
    brk = enc.planner.weighing.calibration_break(args.docs, args.docs * args.doc_tokens) if int8_here else None
    if brk is not None:
        base_s = brk.base_graph_s if brk.base_graph_s is not None else brk.base_s
    else:
        base_s = enc.planner.speeds.doc_seconds(enc.graph, args.doc_tokens)
    documents = {"base": {"backend": enc.graph.variant, "ms_per_doc": base_s * 1000, "doc_tokens": args.doc_tokens,
                          "estimated": brk is not None and brk.base_estimated}}
    if brk is not None:
        if not brk.against_base:  # the int8 graph made without calibration, measured faster here
            documents["weights"] = {"backend": brk.against, "ms_per_doc": brk.base_s * 1000, "measured": True,
                                    "made_seconds": _made_seconds(enc.planner.weights_graph)}
        documents["int8"] = {"backend": backend.name, **brk.to_dict(),
                             **({"made_seconds": _made_seconds(calibrated)} if calibrated is not None else {})}
        doc_choice = backend.name if brk.pays else enc.graph.variant if brk.against_base else brk.against
        doc_why = (f"int8 saves {brk.saving_s:.1f} s on {args.docs} documents against {brk.against_phrase}, its "
                   f"calibration {'made already' if calibrated is not None else f'{brk.calibration_s:.1f} s'} "
                   f"({'measured' if brk.measured else 'assumed until measured'}; {brk.break_even_phrase()})")
    elif int8_here:
        doc_choice = enc.graph.variant
        doc_why = (f"int8 is assumed no faster than the base graph on this CPU (x{platform.int8_prior:.2f} until "
                   "measured: `retr doctor --export` makes and times it)")
    else:
        doc_choice = base_of(config.backend).name
        why_pruned = dict(pruned).get(backend.name)
        doc_why = "the configured graph, the only document candidate here" + (
            f" ({backend.name} pruned: {why_pruned})" if why_pruned else "")
    not_cached = [b.name for b in kept if b.name not in queries.candidates and not b.calibrated and b.queries]
    runs = [_first_run_at(enc, backend, kept, costs, n, args.doc_tokens, base_s) for n in SUMMARY_DOCS]
    plan = enc.planner.stored_plan(again=True)  # made from what was just measured, stored: `retr index` reads it
    first_run = {"graph_build_seconds": costs.get(enc.graph.variant), "open_seconds_now": opened_s,
                 "encode_seconds_estimate": args.docs * base_s, "docs": args.docs}
    if "int8" in documents and documents["int8"]["pays"]:
        first_run["encode_seconds_estimate"] = args.docs * documents["int8"]["int8_s"]
        if calibrated is None:
            first_run["calibration_seconds"] = documents["int8"]["calibration_s"]
    elif "weights" in documents:
        first_run["encode_seconds_estimate"] = args.docs * documents["weights"]["ms_per_doc"] / 1000
    return {
        "platform": platform.to_dict(), "model": enc.model_id, "model_hash": enc.model_hash,
        "backend": config.backend,
        "queries": {"chosen": query_choice.backend if query_choice else enc.graph.variant,
                    "why": query_choice.why if query_choice else "the only query candidate in the cache",
                    "candidates": query_rows, "max_rank_noise": queries.bar},
        "documents": {"chosen": doc_choice, "why": doc_why, **documents},
        "pruned": [{"backend": n, "why": w} for n, w in pruned],
        "not_in_cache": not_cached,
        "first_run": first_run,
        "plan": {"path": str(PlanStore(cache_home()).path(plan.key)), **plan.to_dict()},
        "summary": _summary(platform.to_dict(), query_choice.backend if query_choice else enc.graph.variant,
                            doc_choice, runs, not_cached, args.doc_tokens,
                            _per_doc(runs)),
    }


def _summary(p: dict, query_graph: str, doc_graph: str, runs: list[dict], not_cached: list[str],
             doc_tokens: int, per_doc_s: float) -> dict:
    klass = cpu_class(p)
    measured, measured_s = CLASS_FIRST_RUN.get(klass, (None, None))
    # SciFact's encoding as estimated here, against that class's whole first run: the encoding is most of it
    ratio = SCIFACT_DOCS * per_doc_s * SCIFACT_TOKENS / doc_tokens / measured_s if measured_s else None
    if not_cached:
        suggestion = (f"`retr doctor --export` once: it makes and times the graphs not tried yet here "
                      f"({', '.join(not_cached)}), and retr then uses the fastest")
    elif klass in ("AVX2 only", "AVX-512 without VNNI", "no AVX2"):
        suggestion = ("for a large corpus, encode where int8 runs natively (AVX-512 VNNI or AMX: the studies "
                      "measured about 4x faster first runs) or on more cores (`retr index --executor ray`); "
                      "`--max-length 128` halves the encoding of long documents")
    else:
        suggestion = "none: this CPU runs the graphs retr measured fastest for it"
    return {"cpu_class": klass, "documents_graph": doc_graph, "queries_graph": query_graph,
            "precision": p.get("precision"), "doc_tokens": doc_tokens, "first_runs": runs,
            "measured_on_class": measured, "estimate_against_class": ratio, "suggestion": suggestion}


def _print_summary(r: dict) -> None:
    p, s = r["platform"], r["summary"]
    print(f"CPU: {p['cpu']}, {p['cores']} cores: {s['cpu_class']}"
          + ("" if s["cpu_class"] in ("AMX", "AVX-512 VNNI") else
             " (no int8 dot-product instructions: int8 would only be emulated)"))
    print(f"graphs: documents through {s['documents_graph']}, queries through {s['queries_graph']} "
          f"(computing in {s['precision']})")
    runs = ", ".join(f"{x['docs']:,} documents {_duration(x['seconds'])}" for x in s["first_runs"])
    print(f"first run here ({r['model']}, documents of {s['doc_tokens']} tokens, graphs made included): {runs}")
    ref = s.get("measured_on_class")
    if ref:
        print(f"  measured on this class: SciFact's first `retr eval` (5,183 documents, whole process, 2 cores) on "
              f"{ref}")
        ratio = s.get("estimate_against_class")
        if ratio is not None and ratio > 1.5:
            print(f"  here its encoding alone is estimated at {ratio:.1f}x that: a busy machine (other work on these "
                  "cores) or slower cores than those")
        elif ratio is not None:
            print("  the estimate here is in line with it")
    print(f"suggestion: {s['suggestion']}")


def _print(r: dict) -> None:
    """The detail behind the summary (``--verbose``)."""
    p = r["platform"]
    print(f"CPU: {p['cpu']} ({p['cores']} cores; {p['threads']} inference threads; graphs compute in "
          f"{p['precision']}; int8 dot products: {'yes' if p['int8_dot'] else 'no'}; AMX: "
          f"{'yes' if p['amx'] else 'no'})")
    probe = p.get("precision_probe")
    if probe:
        verdict = "bf16" if probe["bf16_pays"] else f"fp32, bf16 not more than {probe['margin']:.0%} faster"
        print(f"  bf16 or fp32 (measured once here): bf16 {probe['bf16_ms']:.1f} ms, fp32 {probe['fp32_ms']:.1f} ms "
              f"on two feed-forward blocks: {verdict}")
    elif p.get("bf16_native") is False:
        print("  bf16: no native instructions here: fp32")
    print(f"model: {r['model']} ({r.get('model_hash', '')[:12]}), --backend {r['backend']}")
    if "queries" not in r:
        print(r["why"])
        return
    print("queries (one alone, ms):")
    doctor_rerank.print_rows(r["queries"]["candidates"], "8.2f", r["queries"]["max_rank_noise"])
    print(f"  chosen: {r['queries']['chosen']} - {r['queries']['why']}")
    d = r["documents"]
    print(f"documents (ms per document of {d['base']['doc_tokens']} tokens): {d['base']['backend']} {d['base']['ms_per_doc']:.1f}"
          + (" (estimated from the precision probe, not timed)" if d["base"].get("estimated") else "")
          + (f", {d['weights']['backend']} {d['weights']['ms_per_doc']:.1f} (measured)"
             if "weights" in d else "")
          + (f", {d['int8']['backend']} {1000 * d['int8']['int8_s']:.1f}"
             f" ({'measured' if d['int8']['measured'] else 'assumed'})" if "int8" in d else ""))
    print(f"  chosen: {d['chosen']} - {d['why']}")
    plan = r["plan"]
    print(f"graph plan (what `retr index` reads; nothing timed there): {plan['path']}: from "
          f"{plan['min_docs']} documents {plan['large_graph'] or 'weighed per corpus'} ({plan['why']})")
    for x in r["pruned"]:
        print(f"pruned: {x['backend']}: {x['why']}")
    if r["not_in_cache"]:
        print(f"not timed (not in the cache; `retr doctor --export` makes and times them): "
              f"{', '.join(r['not_in_cache'])}")
    f = r["first_run"]
    build = f"{f['graph_build_seconds']:.1f} s graph build, " if f.get("graph_build_seconds") else ""
    calib = f"{f['calibration_seconds']:.1f} s int8 calibration, " if f.get("calibration_seconds") else ""
    print(f"first run on {f['docs']} new documents here: {build}{calib}~{f['encode_seconds_estimate']:.0f} s "
          "encoding")


def run(args: argparse.Namespace) -> int:
    report = _report(args)
    rerank = doctor_rerank.report(args)
    if rerank is not None:
        report["rerank"] = rerank
    if args.json:
        print(json.dumps(report, indent=2))
    elif "summary" not in report:  # torch: nothing to time
        _print(report)
    else:
        _print_summary(report)
        if args.detail or args.verbose:
            print("\ndetail:")
            _print(report)
        else:
            print("(the detail behind this: retr doctor --verbose)")
        if rerank is not None:
            doctor_rerank.print_report(rerank)
    return 0
