"""p99 latency of `retr serve` under 32 concurrent clients, with and without new generations being published.

Builds an index of the first ``--docs`` documents of a collection (BM25 and dense; ``--built DIR`` keeps it for
the next run), starts `retr serve` on a copy of it on 127.0.0.1 in its own process, and runs ``--clients``
closed-loop client threads (``serve_load.level``: one keep-alive connection each, one query per request) in
three phases:

* ``no swap``: nothing else runs;
* ``writer elsewhere``: a publisher process adds ``--batch`` documents every ``--every`` seconds to another copy
  of the index, one the server does not serve (the writer's own CPU and disk, no swap: the control);
* ``swap``: a publisher adds them to the served folder, so that the server opens, warms and swaps in a new
  generation each time.

On a shared machine the load drifts, so the phases run in ``--rounds`` alternating rounds of ``--seconds``
each, and ``--peer-python`` (another checkout's interpreter, its editable install) serves its own copy in the
same rounds. A publisher is started (its imports, its encoder) before the rounds and is told when to publish;
between rounds it is stopped and the server has opened what it published. Prints p50/p95/p99 per phase and
``swap_p99 / no_swap_p99``; the CPU and the load average are recorded.

    nice -n 10 python benchmarks/serve_swap.py --rounds 2 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import command_line, cpu, percentiles, write_result
from serve_load import _free_port, level

PHASES = ("no swap", "writer elsewhere", "swap")


def publisher(folder: str, source: str, every: float, batch: int) -> int:
    """Child mode: print "ready"; on "go" (stdin) add ``batch`` new documents from ``source`` (JSONL) to ``folder``
    every ``every`` seconds (or back to back when an add takes longer) until "stop", then print how many adds it
    has made in all; at the end of stdin, print the seconds each add took, as JSON."""
    import queue

    from retr.indexes.corpus import corpus_of
    from retr.indexes.update import add_documents
    from retr.retrieval.types import Document

    docs = [json.loads(line) for line in Path(source).read_text().splitlines()]
    commands: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("end")

    threading.Thread(target=read, daemon=True).start()
    print("ready", flush=True)
    took: list[float] = []
    command = ""
    while command != "end" and (command := commands.get()) != "end":
        while command == "go" and (len(took) + 1) * batch <= len(docs):
            part = docs[len(took) * batch:(len(took) + 1) * batch]
            t0 = time.perf_counter()
            add_documents(folder, corpus_of([Document(d["_id"], d.get("title", ""), d.get("text", ""))
                                             for d in part], Path(source)))
            took.append(time.perf_counter() - t0)
            try:
                command = commands.get(timeout=max(0.001, every - took[-1]))  # "stop" (or "end")
            except queue.Empty:
                pass
        print(len(took), flush=True)
    print(json.dumps(took), flush=True)
    return 0


class Publisher:
    def __init__(self, target: Path, extra: Path, args):
        self.proc = subprocess.Popen([sys.executable, __file__, "--publisher", str(target), str(extra),
                                      "--every", str(args.every), "--batch", str(args.batch)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def tell(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> list[float]:
        self.proc.stdin.close()
        took = json.loads(self.proc.stdout.readline())
        self.proc.wait(60)
        return took


def healthz(url: str) -> dict:
    with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
        return json.loads(r.read())


class Served:
    """One `retr serve` process over its own copy of the index, with its two publishers."""

    def __init__(self, python: str, built: Path, home: Path, extra: Path, args):
        for name in ("served", "spare"):
            shutil.copytree(built, home / name)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = subprocess.Popen([python, "-m", "retr.cli.main", "-q", "serve", str(home / "served"),
                                        "--port", str(self.port)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        deadline = time.time() + 300
        while True:
            try:
                self.documents = healthz(self.url)["documents"]
                break
            except OSError:
                if self.server.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"retr serve did not start: {self.server.stderr.read()[-2000:]}") from None
                time.sleep(0.2)
        self.writers = {"writer elsewhere": Publisher(home / "spare", extra, args),
                        "swap": Publisher(home / "served", extra, args)}
        self.latencies: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.errors = dict.fromkeys(PHASES, 0)
        self.opened = dict.fromkeys(PHASES, 0)

    def phase(self, name: str, args, queries: list[str]) -> None:
        before = healthz(self.url)["opened"]
        writer = self.writers.get(name)
        if writer is not None:
            writer.tell("go")
        samples: list[float] = []
        r = level(self.url + "/search", queries, args.clients, args.seconds, {"k": args.k, "mode": args.mode},
                  samples=samples)
        if writer is not None:
            writer.tell("stop")
            adds = int(writer.proc.stdout.readline())
            if name == "swap":  # what it published is served before the next phase starts
                while healthz(self.url)["opened"] < 1 + adds:
                    time.sleep(0.1)
        self.latencies[name] += samples
        self.errors[name] += r["errors"]
        self.opened[name] += healthz(self.url)["opened"] - before

    def close(self) -> dict:
        adds = {name: w.close() for name, w in self.writers.items()}
        self.server.terminate()
        self.server.wait(10)
        out = {phase: {**percentiles(self.latencies[phase]), "errors": self.errors[phase],
                       "generations_opened_during": self.opened[phase], "add_seconds": adds.get(phase, [])}
               for phase in PHASES}
        out["swap_p99_over_no_swap_p99"] = out["swap"]["p99"] / out["no swap"]["p99"]
        out["writer_elsewhere_p99_over_no_swap_p99"] = out["writer elsewhere"]["p99"] / out["no swap"]["p99"]
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--docs", type=int, default=1000, help="the first N documents are indexed")
    p.add_argument("--built", default=None, help="keep the built index here (reused when it exists: any index "
                   "folder, e.g. retr's cached one of the whole collection)")
    p.add_argument("--extra", default=None, help="a JSONL of the documents the adds bring (default: the "
                   "collection's after the first --docs; their ids get the prefix 'new-')")
    p.add_argument("--mode", default="bm25", choices=("bm25", "dense", "hybrid"))
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0, help="per phase and round")
    p.add_argument("--every", type=float, default=3.0, help="seconds between two adds (at the least)")
    p.add_argument("--batch", type=int, default=10, help="documents each add brings")
    p.add_argument("--peer-python", default=None, help="another checkout's interpreter: its server measured too")
    p.add_argument("--out", default="benchmarks/results/serve_swap.json")
    p.add_argument("--publisher", nargs=2, metavar=("FOLDER", "JSONL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.publisher:
        return publisher(*args.publisher, args.every, args.batch)

    lines = (Path(args.dataset) / "corpus.jsonl").read_text().splitlines()
    queries = [json.loads(q)["text"] for q in (Path(args.dataset) / "queries.jsonl").read_text().splitlines()]
    results = {"command": command_line(), "cpu": cpu(), "load_average_before": os.getloadavg(),
               "dataset": args.dataset, "docs": args.docs, "built": args.built, "extra": args.extra, "mode": args.mode, "k": args.k, "clients": args.clients,
               "rounds": args.rounds, "seconds_per_round": args.seconds, "every_s": args.every, "batch": args.batch}
    with tempfile.TemporaryDirectory(prefix="serve-swap-") as tmp:
        tmp = Path(tmp)
        built = Path(args.built) if args.built else tmp / "built"
        if not (built / "manifest.json").exists():
            (tmp / "slice.jsonl").write_text("\n".join(lines[:args.docs]) + "\n")
            subprocess.run([sys.executable, "-m", "retr.cli.main", "-q", "index", "--corpus",
                            str(tmp / "slice.jsonl"), "--out", str(built)], check=True)
        extra = tmp / "extra.jsonl"
        added = Path(args.extra).read_text().splitlines() if args.extra else lines[args.docs:]
        extra.write_text("\n".join(json.dumps({**json.loads(d), "_id": f"new-{json.loads(d)['_id']}"})
                                   for d in added) + "\n")
        pythons = {"this checkout": sys.executable, **({"peer": args.peer_python} if args.peer_python else {})}
        servers = {name: Served(python, built, tmp / f"s{i}", extra, args)
                   for i, (name, python) in enumerate(pythons.items())}
        for served in servers.values():  # warm-up, untimed
            level(served.url + "/search", queries, args.clients, 2.0, {"k": args.k, "mode": args.mode})
        for _ in range(args.rounds):
            for phase in PHASES:
                for served in servers.values():
                    served.phase(phase, args, queries)
        results["load_average_after"] = os.getloadavg()
        results["documents_served"] = next(iter(servers.values())).documents
        results["servers"] = {name: {"python": pythons[name], **served.close()} for name, served in servers.items()}

    print(f"retr serve, {results['documents_served']} documents, {args.mode}, k={args.k}, "
          f"{args.clients} clients, {args.rounds} rounds of {args.seconds:g} s per phase, an add of {args.batch} "
          f"documents every {args.every:g} s at most; CPU: {cpu()}")
    print(f"{'server':>14} {'phase':>17} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
          f"{'opened':>7}")
    for name, out in results["servers"].items():
        for phase in PHASES:
            r = out[phase]
            print(f"{name:>14} {phase:>17} {r['n']:>9} {r['errors']:>7} {r['p50']:>8.2f} {r['p95']:>8.2f} "
                  f"{r['p99']:>8.2f} {r['generations_opened_during']:>7}")
        print(f"{name:>14} swap p99 / no-swap p99: {out['swap_p99_over_no_swap_p99']:.2f} (writer elsewhere: "
              f"{out['writer_elsewhere_p99_over_no_swap_p99']:.2f})")
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
