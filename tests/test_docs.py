"""The docs hold: the README stays short with its workflows first, the getting-started example runs, every `retr`
command the README and the guides show parses with the real parser, the generated pages (OpenAPI schema, results
index) are current, and the site builds with `mkdocs build --strict` where mkdocs is installed."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_BYTES = 15 * 1024
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
# pages whose command lines are the user's: the README, getting started and every guide (the studies keep the
# commands as they were run, old option names included)
COMMAND_PAGES = [README, DOCS / "getting-started.md", *sorted((DOCS / "guides").glob("*.md"))]


def _blocks(path: Path, *languages: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text(encoding="utf-8")) if lang in languages]


def _gen(name: str):
    """A generator script under docs/_gen/, loaded from its file (it is not part of the package)."""
    spec = importlib.util.spec_from_file_location(f"docs_gen_{name}", DOCS / "_gen" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def retr_commands(text: str, prompted_only: bool = False) -> list[list[str]]:
    """Every `retr ...` command line in shell text: continuation lines joined, comments dropped, split at `&&`,
    `;` and `|`, a leading `$ ` prompt and `VAR=value` assignments skipped. ``prompted_only``: only the lines after
    a `$ ` prompt (a transcript, where the other lines are output)."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if prompted_only and not line.startswith("$ "):
            continue
        line = line.removeprefix("$ ")
        if "retr" not in line:
            continue
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for word in [*words, "&&"]:
            if word not in ("&&", ";", "|", "||"):
                segment.append(word)
                continue
            while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
                segment.pop(0)
            if segment and segment[0] == "retr":
                commands.append(segment[1:])
            segment = []
    return commands


def test_retr_commands_are_found_in_shell_text():
    text = ("python3 -m venv .venv && . .venv/bin/activate && RETR_DATA=x retr eval --dataset scifact  # note\n"
            "$ retr eval --dataset a \\\n     --out r.json\nretrieve --me\n")
    assert retr_commands(text) == [["eval", "--dataset", "scifact"], ["eval", "--dataset", "a", "--out", "r.json"]]
    assert retr_commands("retr serve: listening on http://127.0.0.1:8000/\n$ retr compact x", True) == [["compact", "x"]]


def test_the_readme_is_short_with_its_workflows_first():
    text = README.read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/"
    headings = re.findall(r"^## (.+)$", text, re.M)
    workflows = ["Your own corpus: index, search, serve", "A BEIR evaluation", "Training"]
    assert headings[1:4] == workflows, f"the three workflows come right after Install: {headings}"
    assert "ruff check . && python -m pytest -q" in text  # the test command .ci/run runs, verbatim


def test_the_readme_links_resolve():
    """mkdocs checks the site's links; the README's (read on the repository's web page) are checked here."""
    text = README.read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert len(targets) >= 5, targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_retr_command_shown_parses(page, capsys):
    from retr.cli import surface
    from retr.cli.main import build_parser

    commands = [c for body in _blocks(page, "bash", "sh") for c in retr_commands(body)]
    commands += [c for body in _blocks(page, "console", "text") for c in retr_commands(body, prompted_only=True)]
    if page in (README, DOCS / "getting-started.md"):
        assert len(commands) >= 6, f"{page.name}: expected its workflows' commands, found {commands}"
    refused = []
    for argv in commands:
        surface._warned.clear()  # an old option name parses, with its warning: the docs show the one to use
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            if e.code not in (0, None):  # --version and --help exit 0
                refused.append(f"retr {shlex.join(argv)}: {capsys.readouterr().err.strip().splitlines()[-1]}")
        warned = [line for line in capsys.readouterr().err.splitlines() if "is deprecated" in line]
        refused += [f"retr {shlex.join(argv)}: {line}" for line in warned]
    assert not refused, f"{page.relative_to(REPO)}: commands the parser refuses or warns about:\n" + "\n".join(refused)


def test_the_python_examples_run(tiny_bi_encoder, tmp_path, monkeypatch, capsys):
    """Each ```python block of getting-started.md, then of the Python API page (which reads the notes the first
    wrote), as written, on the tiny fixture model (ONNX Runtime) in place of the bundled one: the dense ranking is
    random there, so the pages assert on BM25's only."""
    import retr

    build, load = retr.Index.build.__func__, retr.Index.load.__func__
    tiny = {"model": str(tiny_bi_encoder), "backend": "onnx"}
    monkeypatch.setattr(retr.Index, "build", classmethod(lambda cls, *a, **kw: build(cls, *a, **{**tiny, **kw})))
    monkeypatch.setattr(retr.Index, "load", classmethod(lambda cls, *a, **kw: load(cls, *a, **{"backend": "onnx",
                                                                                              **kw})))
    monkeypatch.chdir(tmp_path)
    out = {}
    for page in (DOCS / "getting-started.md", DOCS / "reference" / "python-api.md"):
        blocks = _blocks(page, "python")
        assert blocks, f"{page.name} has no python example"
        for i, code in enumerate(blocks):
            exec(compile(code, f"{page.relative_to(REPO)}[python {i}]", "exec"), {"__name__": "docs_example"})
        out[page.name] = capsys.readouterr().out.splitlines()
    started = out["getting-started.md"]
    assert [line.split()[0] for line in started[:3]] == ["bm25", "dense", "hybrid"]
    assert all("'total'" in line for line in started[:3])  # each search's latency per stage, with the total
    assert started[3].startswith("n2 The VPN needs a hardware token") and "'team': 'it'" in started[3]
    assert (tmp_path / "notes.idx" / "manifest.json").is_file()
    ranks = [line.split()[0] for line in out["python-api.md"]]
    assert ranks == ["1", "2", "3"], out["python-api.md"]  # k=5 over the three notes


@pytest.fixture(scope="module")
def tiny_index(tiny_dataset, tiny_bi_encoder, tmp_path_factory) -> Path:
    """An index folder as `retr index` writes it by default (flat + BM25), of the fixture corpus, encoded afresh
    (the page shows a first build's encoding record, not one taken from the embedding cache)."""
    from retr.cli.main import main

    idx = tmp_path_factory.mktemp("docs") / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(idx), "--model", str(tiny_bi_encoder),
                 "--backend", "onnx", "--no-cache"]) == 0
    return idx


def _key_paths(node, prefix=""):
    """Every dotted key path of a JSON value, with the JSON kind of its value (object, array, string, number ...)."""
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
             type(None): "null"}
    out = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "...":  # the page's "and the rest" marker
                continue
            path = f"{prefix}{key}"
            out[path] = kinds[type(value)]
            out.update(_key_paths(value, path + "."))
    return out


def test_the_index_format_page_matches_a_built_index(tiny_index):
    """Every key of the page's example manifest is in a manifest `retr index` writes now (same kind of value), every
    top-level key written is shown, and every file of the folder is named in the page's table."""
    import json

    page = (DOCS / "reference" / "index-format.md").read_text(encoding="utf-8")
    example = json.loads(_blocks(DOCS / "reference" / "index-format.md", "json")[0])
    real = json.loads((tiny_index / "manifest.json").read_text())
    shown, written = _key_paths(example), _key_paths(real)
    wrong = {k: (v, written.get(k)) for k, v in shown.items()
             if written.get(k) != v and not (v == "null" or written.get(k) == "null") and not k.startswith("files.")}
    assert not wrong, f"docs/reference/index-format.md shows keys a built manifest lacks or types differently: {wrong}"
    assert set(real) == set(example), f"top-level manifest keys: built {sorted(real)}, shown {sorted(example)}"
    unnamed = [p.name for p in tiny_index.rglob("*") if p.is_file() and f"`{p.name}`" not in page
               and p.name not in page]
    assert not unnamed, f"files of an index folder the page does not name: {unnamed}"


def test_the_openapi_schema_is_current(tiny_index):
    pytest.importorskip("fastapi")
    from retr.retrieval.encoder import EncoderConfig
    from retr.serve.config import ServeConfig

    gen = _gen("openapi")
    now = gen.render(gen.schema(tiny_index, ServeConfig(encoder=EncoderConfig(backend="onnx"))))
    assert set(gen.json.loads(now)["paths"]) >= {"/search", "/healthz", "/metrics"}
    assert gen.OUT.read_text(encoding="utf-8") == now, \
        f"{gen.OUT.relative_to(REPO)} is stale: python docs/_gen/openapi.py INDEX_DIR (any index folder)"


def test_the_results_index_is_current():
    gen = _gen("results_index")
    text = gen.render()
    assert gen.OUT.read_text(encoding="utf-8") == text, "docs/studies/results.md is stale: " \
                                                         "python docs/_gen/results_index.py"
    assert text.count("| `benchmarks/results/") == sum(1 for p in gen.RESULTS.iterdir() if p.is_file())
    assert "[Lean ANN index at 1M and 10M vectors](lean-ann.md)" in text  # a study names its file: linked


def test_the_results_pattern_reader_expands_what_the_studies_write():
    gen = _gen("results_index")
    match = lambda name, written: any(p.match(name) for p in gen._cites(f"see `{written}`"))  # noqa: E731
    assert match("rerank-curve-npl-ce1.json", "benchmarks/results/rerank-curve-<set>-ce1.json")
    assert not match("rerank-curve-npl-ce1-d3.json", "rerank-curve-<set>-ce1.json")
    assert match("attention-export-amx-f32.json", "attention-export-amx-{bf16,f32,ce}.json")
    assert match("speed-7.json", "speed-7[-npl|-cisi].json") and match("speed-7-cisi.json", "speed-7[-npl|-cisi].json")
    assert not match("speed-7-amx.json", "speed-7[-npl|-cisi].json")
    assert not match("speed-7.json", "benchmarks/results/*.json") and not match("speed-7.json", "notes.jsonl")
    assert match("int8-quality-scifact-trained-1epoch-amx-gen3.json", "...-1epoch-amx-gen3.json")


def _have(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:  # a dotted name whose parent package is absent
        return False


@pytest.mark.skipif(not _have("mkdocs"), reason="mkdocs not installed (pip install -e '.[docs]')")
def test_the_site_builds_strict(tmp_path):
    missing = [pkg for m, pkg in (("material", "mkdocs-material"), ("mkdocstrings_handlers.python", "mkdocstrings[python]"))
               if not _have(m)]
    assert not missing, (f"mkdocs is installed without {missing}: the docs extra in pyproject.toml must bring them "
                         "(docs = [\"mkdocs>=1.6\", \"mkdocs-material>=9.5\", \"mkdocstrings[python]>=1.0\"])")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    # (--quiet would hide the warnings from --strict's count: a broken link then built green)
    assert "WARNING" not in done.stderr, done.stderr
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()  # its links, written from the root
    assert 'href="../studies/measured-choices/"' in changelog and 'href="docs/' not in changelog
    assert (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text().count('id="retr.Index.') >= 3


def test_no_page_speaks_of_issues_by_number_or_of_sessions():
    """The docs speak in the project's voice (what was measured, on which CPU, with which command, what it showed),
    not of the tracker or of who worked when: no "issue 39", no "the tenth session". Inline code (a file's name)
    is not prose."""
    import re

    said = re.compile(r"\bissues?\s*#?\d+|\bsessions?\b", re.IGNORECASE)
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            prose = re.sub(r"`[^`]*`", "", line)
            if said.search(prose):
                found.append(f"{page.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
