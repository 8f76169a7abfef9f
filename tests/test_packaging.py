"""Packaging: every third-party import of retr's modules is declared in pyproject.toml (in the base dependencies or
in the extra its module belongs to), the test extra installs what the tests import, no test imports a benchmark,
and the license is there."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from .conftest import REPO

PACKAGES = ("retrieval", "indexes", "eval", "train", "cli", "serve", "api")
# import name -> distribution, where they differ by more than "_" / "-"
DISTRIBUTIONS = {
    "faiss": "faiss-cpu",
    "Stemmer": "PyStemmer",
    "sklearn": "scikit-learn",
    "yaml": "pyyaml",
    "pytrec_eval": "pytrec-eval-terrier",
    "seismic": "pyseismic-lsr",
}
# the modules whose imports an extra provides (a folder ends with "/"): the rest may import only the base dependencies
MODULE_EXTRAS = {
    "retrieval/sparse.py": "sparse",
    "train/": "train",
    "cli/serve.py": "serve",
    "serve/": "serve",
    "cli/report.py": "report",
    "eval/visual.py": "report",
    "indexes/ray_encode.py": "ray",
    "eval/irds.py": "irds",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _declared(extra: str | None) -> set[str]:
    """The distributions the base install (``extra`` None) or ``retr[extra]`` brings, following retr[...] inside."""
    project = _project()
    requirements = list(project["dependencies"])
    if extra is not None:
        requirements += project["optional-dependencies"][extra]
    names = set()
    for req in requirements:
        name = _requirement_name(req)
        if name == "retr":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):
                names |= _declared(inner.strip())
        else:
            names.add(name)
    return names


def _third_party_imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports (module level or inside functions), stdlib and retr aside."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("retr", "__future__")}


def _distribution(import_name: str) -> str:
    return _normalise(DISTRIBUTIONS.get(import_name, import_name))


def _extra_of(relative: str) -> str | None:
    return next((extra for prefix, extra in MODULE_EXTRAS.items()
                 if relative == prefix or (prefix.endswith("/") and relative.startswith(prefix))), None)


def test_every_import_of_the_package_is_declared_where_its_module_belongs():
    undeclared = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            extra = _extra_of(relative)
            declared = _declared(extra)
            for name in sorted(_third_party_imports(path)):
                if _distribution(name) not in declared:
                    undeclared.append(f"{relative} imports {name} ({_distribution(name)}), not declared in "
                                      f"{'the dependencies' if extra is None else f'the {extra} extra'}")
    assert not undeclared, "\n".join(undeclared)


def test_the_checker_sees_an_undeclared_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import json\nimport numpy as np\n\ndef f():\n    from datasets import Dataset\n    import fastapi.x\n")
    assert _third_party_imports(module) == {"numpy", "datasets", "fastapi"}
    assert _distribution("datasets") not in _declared(None) and _distribution("numpy") in _declared(None)
    assert _distribution("datasets") in _declared("train") and _distribution("fastapi") in _declared("serve")
    assert _extra_of("train/bi_encoder.py") == "train" and _extra_of("retrieval/encoder.py") is None


def test_training_stack_is_an_extra_and_its_check_names_it():
    from retr.train.runtime import TRAIN_EXTRA

    train_only = _declared("train") - _declared(None)
    assert {"datasets", "accelerate"} <= train_only  # a search-only install does not bring pyarrow and pandas
    assert {_distribution(n) for n in TRAIN_EXTRA} == {_requirement_name(r)
                                                        for r in _project()["optional-dependencies"]["train"]}
    assert "pytrec-eval-terrier" not in _declared(None)  # only the tests use it


def test_the_test_extra_installs_what_the_tests_import():
    declared = _declared("test")
    # the test extra brings every other extra the suite drives
    assert {"train", "serve", "report", "ray", "docs", "irds"} <= {
        e.strip() for r in _project()["optional-dependencies"]["test"] if _requirement_name(r) == "retr"
        for e in re.search(r"\[(.*)\]", r).group(1).split(",")}
    local = {p.stem for p in (REPO / "tests").rglob("*.py")}
    missing = [f"{path.relative_to(REPO)} imports {name}" for path in sorted((REPO / "tests").rglob("*.py"))
               for name in sorted(_third_party_imports(path) - local) if _distribution(name) not in declared]
    assert not missing, "\n".join(missing)
    assert {"mkdocs", "mkdocs-material", "hypothesis", "pytest"} <= declared


def test_no_test_imports_a_benchmark():
    benchmarks = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        text = path.read_text()
        if re.search(r"sys\.path\.(insert|append)\([^)]*benchmarks", text):
            offenders.append(f"{path.relative_to(REPO)}: puts benchmarks/ on sys.path")
        offenders += [f"{path.relative_to(REPO)} imports {name}"
                      for name in sorted(_third_party_imports(path) & benchmarks)]
    assert not offenders, "\n".join(offenders)


def test_the_license_is_the_apache_license_pyproject_names():
    text = (REPO / "LICENSE").read_text()
    assert _project()["license"] == {"text": "Apache-2.0"}
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000


def test_the_docs_extra_installs_the_theme_and_plugins_mkdocs_yml_names():
    text = (REPO / "mkdocs.yml").read_text()
    theme = re.search(r"^theme:\s*\n\s+name:\s*([\w-]+)", text, re.M).group(1)
    block = re.split(r"^\S", text.split("\nplugins:\n", 1)[1], maxsplit=1, flags=re.M)[0]
    plugins = [p for p in re.findall(r"^  - ([\w-]+)", block, re.M) if p != "search"]  # search is mkdocs' own
    declared = _declared("docs")
    assert plugins and "mkdocs" in declared
    missing = [name for name in [f"mkdocs-{theme}", *plugins] if not {name, f"mkdocs-{name}"} & declared]
    assert not missing, f"mkdocs.yml needs {missing}: add them to the docs extra"
