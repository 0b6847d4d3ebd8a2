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
    "update",
    "experience",
    "kernels",
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
    forbidden = ("klear.rollout", "klear.stages", "klear.update", "klear.experience", "klear.kernels", "klear.eval", "klear.prep", "klear.compare", "klear.fit")
    bad = sorted(name for name in imported_modules(path) if name.startswith(forbidden))
    assert not bad, f"{path.name} imports {bad}"


def test_preparation_commands_do_not_import_the_eval_command():
    for path in sorted((PACKAGE / "prep").glob("*.py")):
        assert "klear.eval.cli" not in imported_modules(path), path.name


def test_tests_mirror_the_package():
    tests = Path(__file__).parent
    assert FOLDERS - {path.name for path in tests.iterdir() if path.is_dir()} == set()


LAYERS: dict[str, int] = {
    "klear.__version__": 0,
    "klear.errors": 0,
    "klear.registry": 0,
    "klear.config": 1,  # the schema (klear.config, klear.config.schema)
    "klear.runtime": 2,
    "klear.objectives": 3,
    "klear.rewards": 3,
    "klear.models": 3,
    "klear.data": 4,
    "klear.rollout": 4,
    "klear.config.load": 5,  # checks names against every registry
    "klear.config.help": 5,
    "klear.eval": 6,
    "klear.run": 6,
    "klear.kernels": 6,
    "klear.experience": 7,
    "klear.update": 7,
    "klear.stages": 8,
    "klear.fit": 9,
    "klear.cli": 9,
    "klear.prep": 9,
    "klear.compare": 9,
    "klear.eval.cli": 9,
    "klear.eval.__main__": 9,
    "klear.data.__main__": 9,
}
"""Each module's layer, by its longest prefix here: a module imports only from its own layer or below, so the
building blocks never reach up into what assembles them (the commands at the top, the errors at the bottom)."""


def layer(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYERS:
            return LAYERS[".".join(parts[:end])]
    raise AssertionError(f"{module} has no layer in LAYERS")


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in sources():
        name = ".".join(("klear", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        for imported in imported_modules(path):
            if imported != "klear" and layer(imported) > layer(name):
                upward.append(f"{name} ({layer(name)}) imports {imported} ({layer(imported)})")
    assert not upward, "\n".join(sorted(upward))
