"""The ``pytest`` test kind of the sandbox harness (`sandbox_harness`), run inside its confined child.

The child writes the test file as ``test_solution.py``, the program as ``solution.py`` (for tracebacks) and an
empty ``pytest.ini``, then runs pytest in-process on that file with no cache, no plugin autoloading and no config
file above the work directory. ``import solution`` is served from memory (`_SolutionFinder`: the prelude, then
the program), so the program runs only when the test file imports it, as in the publishers' set-up, and cannot
rewrite the test file before pytest read it. Standard library only at import: pytest is imported by the child,
from the interpreter's installation, after it dropped its privileges.
"""

from __future__ import annotations

import builtins
import importlib.util
import os
import sys
from typing import Any

# pytest without the caches, the plugins installed beside it or any config file above the work directory.
_PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", ".", "--confcutdir", "."]


def run_pytest(source: str, code: str, prelude: str, token: bytes | None) -> int:
    """Run pytest on the test file in this (confined) child; the token only when every collected test passed."""
    sys.dont_write_bytecode = True
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for name, text in (("test_solution.py", source), ("solution.py", code), ("pytest.ini", "[pytest]\n")):
        with open(name, "w", encoding="utf-8") as file:
            file.write(text)
    import pytest  # from the interpreter's installation, after the privileges were dropped

    main, write, record = pytest.main, os.write, _PytestRecord()
    finder = _SolutionFinder(prelude, code, os.path.abspath("solution.py"))
    sys.meta_path.insert(0, finder)  # `import solution` runs prelude + program lazily, during collection
    exit_code = main([*_PYTEST_ARGS, "test_solution.py"], plugins=[record])
    if exit_code == 1 and record.failed:  # pytest.ExitCode.TESTS_FAILED
        write(3, b"assertion")
    elif exit_code == 0 and finder.imported and record.collected and record.passed == record.collected:
        write(3, token)
    return 0


class _PytestRecord:
    """A pytest plugin counting collected, passed and failed tests (a skipped test is neither)."""

    def __init__(self) -> None:
        self.collected = self.passed = self.failed = 0

    def pytest_collection_finish(self, session: Any) -> None:
        self.collected = len(session.items)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.passed += report.when == "call" and report.passed
        self.failed += report.failed


class _SolutionFinder:
    """Imports module ``solution`` from memory: the prelude, then the program, in the module's namespace (so the
    program keeps its line numbers and ``from __future__`` imports, which a file prelude + program would break).
    Once the program ran, the builtins are restored and trace/profile hooks removed, as before check code."""

    def __init__(self, prelude: str, code: str, path: str) -> None:
        self.prelude, self.code, self.path = prelude, code, path
        self.imported = False
        # Taken before the program runs, so that it cannot replace them.
        self.builtins, self.saved, self.hooks = vars(builtins), dict(vars(builtins)), (sys.settrace, sys.setprofile)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self, origin=self.path) if name == "solution" else None

    def create_module(self, spec: Any) -> None:
        return None  # the default module object

    def exec_module(self, module: Any) -> None:
        self.imported = True
        module.__file__ = self.path
        try:
            if self.prelude:
                exec(compile(self.prelude, "prelude.py", "exec"), vars(module))
            exec(compile(self.code, self.path, "exec"), vars(module))
        finally:
            for hook in self.hooks:
                hook(None)
            self.builtins.clear()
            self.builtins.update(self.saved)
