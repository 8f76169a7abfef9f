"""p99 latency of `retr serve` under 32 concurrent clients, with and without new generations being published.

Builds an index of the first ``--docs`` documents of a collection (BM25 and dense), starts `retr serve` on it on
127.0.0.1 in its own process, and runs ``--clients`` closed-loop client threads (``serve_load.level``: one
keep-alive connection each, one query per request) for ``--seconds`` in each phase:

* ``no swap``: nothing else runs;
* ``writer elsewhere``: a publisher process adds ``--batch`` documents every ``--every`` seconds to a copy of the
  index the server does not serve (the writer's own CPU, no swap: the control);
* ``swap``: the same publisher adds them to the served index, so that the server opens, warms and swaps in a new
  generation every ``--every`` seconds.

Prints p50/p95/p99 of each and ``swap_p99 / no_swap_p99``; ``--peer-python`` serves the same folder with another
checkout's interpreter (its editable install) in the same run, for its figures beside these. The CPU is recorded.

    nice -n 10 python benchmarks/serve_swap.py --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import command_line, cpu, write_result
from serve_load import _free_port, level


def publisher(folder: str, source: str, every: float, batch: int, seconds: float) -> int:
    """Child mode: after "ready", add ``batch`` new documents from ``source`` (JSONL) to ``folder`` every ``every``
    seconds for ``seconds``, once "go" arrives on stdin; print the seconds each add took, as JSON."""
    from retr.indexes.corpus import corpus_of
    from retr.indexes.update import add_documents
    from retr.retrieval.types import Document

    docs = [json.loads(line) for line in Path(source).read_text().splitlines()]
    print("ready", flush=True)
    sys.stdin.readline()
    took, start, n = [], time.perf_counter(), 0
    while time.perf_counter() - start < seconds and (n + 1) * batch <= len(docs):
        due = start + (n + 1) * every
        time.sleep(max(0.0, due - time.perf_counter()))
        part = [Document(d["_id"], d.get("title", ""), d.get("text", "")) for d in docs[n * batch:(n + 1) * batch]]
        t0 = time.perf_counter()
        add_documents(folder, corpus_of(part, Path(source)))
        took.append(time.perf_counter() - t0)
        n += 1
    print(json.dumps(took), flush=True)
    return 0


def healthz(url: str) -> dict:
    with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
        return json.loads(r.read())


def serve_phases(python: str, folder: Path, spare: Path, extra: Path, args, queries: list[str]) -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([python, "-m", "retr.cli.main", "-q", "serve", str(folder), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    phases: dict = {}
    try:
        deadline = time.time() + 300
        while True:
            try:
                healthz(url)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"retr serve did not start: {server.stderr.read()[-2000:]}") from None
                time.sleep(0.2)
        body = {"k": args.k, "mode": args.mode}
        level(url + "/search", queries, args.clients, 2.0, body)  # warm-up, untimed
        phases["no swap"] = level(url + "/search", queries, args.clients, args.seconds, body)
        for name, target in (("writer elsewhere", spare), ("swap", folder)):
            before = healthz(url)
            writer = subprocess.Popen([sys.executable, __file__, "--publisher", str(target), str(extra),
                                       "--every", str(args.every), "--batch", str(args.batch),
                                       "--seconds", str(args.seconds)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert writer.stdout.readline().strip() == "ready"
            writer.stdin.write("go\n")
            writer.stdin.flush()
            phases[name] = level(url + "/search", queries, args.clients, args.seconds, body)
            adds = json.loads(writer.stdout.readline())
            writer.wait(60)
            time.sleep(1.0)
            after = healthz(url)
            phases[name].update(adds=len(adds), add_seconds=adds,
                                generations_opened=after["opened"] - before["opened"],
                                generation=after["generation"], documents=after["documents"])
    finally:
        server.terminate()
        server.wait(10)
    phases["swap_p99_over_no_swap_p99"] = phases["swap"]["p99"] / phases["no swap"]["p99"]
    phases["writer_elsewhere_p99_over_no_swap_p99"] = phases["writer elsewhere"]["p99"] / phases["no swap"]["p99"]
    return phases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--docs", type=int, default=1000, help="the first N documents are indexed")
    p.add_argument("--mode", default="bm25", choices=("bm25", "dense", "hybrid"))
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--every", type=float, default=3.0, help="seconds between two published generations")
    p.add_argument("--batch", type=int, default=10, help="documents each generation adds")
    p.add_argument("--peer-python", default=None, help="another checkout's interpreter: its server measured too")
    p.add_argument("--out", default="benchmarks/results/serve_swap.json")
    p.add_argument("--publisher", nargs=2, metavar=("FOLDER", "JSONL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.publisher:
        return publisher(*args.publisher, args.every, args.batch, args.seconds)

    corpus = Path(args.dataset) / "corpus.jsonl"
    lines = corpus.read_text().splitlines()
    queries = [json.loads(q)["text"] for q in (Path(args.dataset) / "queries.jsonl").read_text().splitlines()]
    needed = args.docs + args.batch * (int(args.seconds / args.every) + 1) * 2
    if len(lines) < needed:
        raise SystemExit(f"{corpus}: {len(lines)} documents, {needed} needed")
    results = {"command": command_line(), "cpu": cpu(), "load_average": os.getloadavg(), "dataset": args.dataset,
               "docs": args.docs, "mode": args.mode, "k": args.k, "clients": args.clients, "seconds": args.seconds,
               "every_s": args.every, "batch": args.batch, "servers": {}}
    with tempfile.TemporaryDirectory(prefix="serve-swap-") as tmp:
        tmp = Path(tmp)
        (tmp / "slice.jsonl").write_text("\n".join(lines[:args.docs]) + "\n")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "retr.cli.main", "-q", "index", "--corpus", str(tmp / "slice.jsonl"),
                        "--out", str(tmp / "built")], check=True)
        results["build_seconds"] = time.perf_counter() - t0
        servers = {"this checkout": sys.executable, **({"peer": args.peer_python} if args.peer_python else {})}
        for name, python in servers.items():
            folder, spare, extra = tmp / f"idx-{len(results['servers'])}", tmp / "spare", tmp / "extra.jsonl"
            for path in (folder, spare):
                shutil.rmtree(path, ignore_errors=True)
                shutil.copytree(tmp / "built", path)
            extra.write_text("\n".join(lines[args.docs:needed]) + "\n")
            results["servers"][name] = {"python": python, **serve_phases(python, folder, spare, extra, args, queries)}

    print(f"retr serve, {args.docs} documents of {Path(args.dataset).name}, {args.mode}, k={args.k}, "
          f"{args.clients} clients, {args.seconds:.0f} s per phase, a generation every {args.every:g} s; CPU: {cpu()}")
    print(f"{'server':>14} {'phase':>17} {'requests':>9} {'errors':>7} {'QPS':>7} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'p99 ms':>8} {'opened':>7}")
    for name, phases in results["servers"].items():
        for phase in ("no swap", "writer elsewhere", "swap"):
            r = phases[phase]
            print(f"{name:>14} {phase:>17} {r['requests']:>9} {r['errors']:>7} {r['qps']:>7.1f} {r['p50']:>8.2f} "
                  f"{r['p95']:>8.2f} {r['p99']:>8.2f} {r.get('generations_opened', 0):>7}")
        print(f"{name:>14} swap p99 / no-swap p99: {phases['swap_p99_over_no_swap_p99']:.2f} (writer elsewhere: "
              f"{phases['writer_elsewhere_p99_over_no_swap_p99']:.2f})")
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
