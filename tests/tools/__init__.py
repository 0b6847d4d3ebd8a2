"""Tests of the scripts in ``tools/``, which are files, not modules of the package: `load_tool` imports one."""

import importlib.util
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).parents[2] / "tools"


def load_tool(name: str) -> ModuleType:
    """The script ``tools/<name>.py`` as a module, without running its ``main``."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
