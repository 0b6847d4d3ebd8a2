"""The package layout: folder = concept, small files, folders as layers with no import circle, and the training
input importing no engine, stage or command."""

import ast
import statistics
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "klear"
FOLDERS = {
    "schema",
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
    forbidden = (
        "klear.rollout",
        "klear.stages",
        "klear.update",
        "klear.experience",
        "klear.kernels",
        "klear.eval",
        "klear.prep",
        "klear.compare",
        "klear.fit",
    )
    bad = sorted(name for name in imported_modules(path) if name.startswith(forbidden))
    assert not bad, f"{path.name} imports {bad}"


def test_preparation_commands_do_not_import_the_eval_command():
    for path in sorted((PACKAGE / "prep").glob("*.py")):
        assert "klear.eval.cli" not in imported_modules(path), path.name


def test_tests_mirror_the_package():
    tests = Path(__file__).parent
    assert FOLDERS - {path.name for path in tests.iterdir() if path.is_dir()} == set()


LAYERS: dict[str, int] = {
    "errors": 0,
    "schema": 0,  # the keys of every run config, their defaults and ranges: what every folder reads
    "registry": 1,
    "cli": 1,  # what every command does around its main
    "runtime": 2,
    "objectives": 3,
    "rewards": 3,
    "models": 3,
    "data": 4,
    "rollout": 5,
    "config": 6,  # loading a config checks its names against the registries below
    "kernels": 6,
    "run": 7,
    "eval": 8,
    "experience": 9,
    "update": 10,
    "stages": 11,
    "fit": 12,
    "prep": 12,
    "compare": 12,
}
"""The layer of each folder and top-level module of `klear`, bottom up: a module imports from its own folder or
from a lower layer, never from a folder beside it or above it, so the building blocks never reach up into what
assembles them (the commands at the top, the errors and the schema at the bottom). A folder's ``__main__``, what
``python -m klear.NAME`` runs, is an entry point whatever its folder (``python -m klear.data`` runs `klear.prep`'s
commands): it sits above every command, which `test_no_module_imports_a_main_module` makes sound, since nothing
can depend on it."""
ENTRY_POINTS = max(LAYERS.values()) + 1


def module_name(path: Path) -> str:
    return ".".join(("klear", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")


MODULES = {module_name(path): path for path in sources()}


def resolve(name: str) -> str:
    """The module of the package that an imported name is, or is defined in: ``klear.data.readers.read_rows`` ->
    ``klear.data.readers``; ``klear.__version__`` -> ``klear``."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports: at the top, inside a function, or for type checking only
    (``if TYPE_CHECKING:``). A type-checking import is an edge too: the type checker follows it, and the type it
    names belongs below the module that names it as much as a value does. ``from klear.prep import curate`` is an
    edge to the submodule ``klear.prep.curate`` alone; ``from klear.rewards import Reward`` to ``klear.rewards``."""
    graph = {}
    for name, path in MODULES.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "klear":
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    edges.add(submodule if submodule in MODULES else resolve(node.module))
            elif isinstance(node, ast.Import):
                edges.update(resolve(alias.name) for alias in node.names if alias.name.split(".")[0] == "klear")
        graph[name] = edges - {name, "klear"}
    return graph


def folder(module: str) -> str:
    """``klear.data.readers`` -> ``data``; ``klear.fit`` -> ``fit``."""
    return module.split(".")[1]


def layer(module: str) -> int:
    if module.endswith(".__main__"):
        return ENTRY_POINTS
    assert folder(module) in LAYERS, f"{module}: its folder {folder(module)!r} has no layer in LAYERS"
    return LAYERS[folder(module)]


def test_layers_are_one_entry_per_folder_and_top_level_module():
    top_level = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert set(LAYERS) == FOLDERS | top_level


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{name} ({layer(name)}) imports {imported} ({layer(imported)})"
        for name, imports in import_graph().items()
        for imported in imports
        if folder(imported) != folder(name) and layer(imported) >= layer(name)
    ]
    assert not upward, "\n".join(sorted(upward))


def test_no_module_imports_a_main_module():
    importers = sorted(
        name for name, imports in import_graph().items() if any(m.endswith(".__main__") for m in imports)
    )
    assert not importers


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative): each is a set of
    modules that import each other in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(import_cycles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    """No circle of modules importing each other, counting every import (inside functions and for type checking
    too, `import_graph`): a circle is one concept split across files, or a piece shared by two that belongs
    below both."""
    assert import_cycles(import_graph()) == []
