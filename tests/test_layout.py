"""The package layout: folder = concept, small files, and the training input importing no engine, stage or command."""

import ast
import statistics
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "klear"
FOLDERS = {
    "config",
    "models",
    "data",
    "prep",
    "stages",
    "objectives",
    "rewards",
    "rollout",
    "eval",
    "compare",
    "runtime",
    "run",
}


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every ``klear`` module ``path`` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] == "klear"}


def test_top_level_holds_only_the_entry_points_and_one_folder_per_concept():
    files = {path.name for path in PACKAGE.glob("*.py")}
    assert files == {"__init__.py", "cli.py", "errors.py", "fit.py", "registry.py"}
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders == FOLDERS


def test_no_file_is_long():
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines()) for path in sources()}
    assert max(lengths.values()) <= 600, sorted(lengths.items(), key=lambda item: -item[1])[:3]
    assert statistics.median(lengths.values()) <= 200


@pytest.mark.parametrize("path", sorted((PACKAGE / "data").glob("*.py")), ids=lambda path: path.name)
def test_training_input_imports_no_engine_stage_or_command(path):
    if path.name == "__main__.py":  # the `python -m klear.data` entry point runs the preparation commands
        return
    forbidden = ("klear.rollout", "klear.stages", "klear.eval", "klear.prep", "klear.compare", "klear.fit")
    bad = sorted(name for name in imported_modules(path) if name.startswith(forbidden))
    assert not bad, f"{path.name} imports {bad}"


def test_preparation_commands_do_not_import_the_eval_command():
    for path in sorted((PACKAGE / "prep").glob("*.py")):
        assert "klear.eval.cli" not in imported_modules(path), path.name


def test_tests_mirror_the_package():
    tests = Path(__file__).parent
    assert FOLDERS - {path.name for path in tests.iterdir() if path.is_dir()} == set()
