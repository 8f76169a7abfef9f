"""The layers the README's Architecture section names: every import of a retr module (module-level or lazy)
points to its own layer or one below, and no two modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import REPO

# lowest first; a module's layer is that of the longest prefix listed
LAYERS = {
    "retr.retrieval.errors": 1, "retr.retrieval.types": 1, "retr.retrieval.artifacts": 1,
    "retr.retrieval.protocol": 1, "retr.retrieval.models": 1, "retr.retrieval.progress": 1,
    "retr.retrieval.backends": 2,
    "retr.retrieval": 3,  # encoder, rerank, bm25, dense, fusion, pipeline: work on the objects they are handed
    "retr.indexes": 4,
    "retr.eval": 5,
    "retr.train": 6,
    "retr.cli": 7,
    "retr.serve": 7,  # the HTTP service: beside the commands (`retr serve` imports it lazily), nothing below
    "retr": 8,  # the Python API (api/__init__.py, installed as the package `retr` itself)
    "retr.stages": 8,  # the API's pipeline composition (api/stages.py)
}
PACKAGES = ("retrieval", "indexes", "eval", "train", "cli", "serve", "api")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts[0] == "api":
                parts = parts[1:]
            mods[".".join(["retr", *parts])] = f
    return mods


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or (p != "retr" and module.startswith(p + "."))), key=len)
    return LAYERS[best]


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = {}
    for m, f in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in names:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    targets.add(t)
        edges[m] = targets
    return edges


def test_every_import_points_to_its_own_layer_or_below():
    mods = _modules()
    assert len(mods) > 40 and all(_layer(m) for m in mods)
    upward = sorted(f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
                    for m, targets in _imports(mods).items() for t in targets if _layer(t) > _layer(m))
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = _imports(_modules())
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle.extend(path[path.index(t):] + [m, t] if t in path else [m, t])
                return True
            if t not in state and visit(t, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(edges):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_service_reads_stored_reranker_checks_and_runs_none():
    """`retr serve` takes the check as the explicit step of `retr check-reranker` before it starts (cli.serve); the
    service (retr.serve) and the Searcher read the stored check and never call up into eval to run one."""
    edges = _imports(_modules())
    calls = sorted(f"{m} imports {t}" for m, targets in edges.items() for t in targets
                   if m.startswith(("retr.serve", "retr.indexes")) and t.startswith("retr.eval"))
    assert any(m.startswith("retr.serve") for m in edges) and not calls, calls
