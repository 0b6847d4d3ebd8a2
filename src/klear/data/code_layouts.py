"""The code test layouts of the published RL sets, read into the ``code`` reward's tests (`klear.rewards.code_reward`).

A code row's reference (``reward_model.ground_truth`` in verl rows, usually a JSON string) comes in the layout of
whoever built the set; `code_reference` reads each as it is, by its shape and, where two publishers use the same
shape differently, by the row's data source:

- Code-R1 (Klear-Reasoner's ``coder1*`` rows): ``{"inputs": [...], "outputs": [...]}`` stdin tests (list-valued
  items joined with ", ", as Code-R1 does), ``{"functional": str | [str]}`` test programs run after the solution,
  ``{"pytest": str}`` a pytest file; optional ``timeout`` (seconds per test) and ``max_test_cases`` (that many
  tests sampled per completion; `CODE_R1_MAX_TESTS` when absent, Code-R1's default). Functional and pytest
  programs get the publisher's import prelude (the standard-library names and the LeetCode helpers
  ``ListNode``, ``TreeNode``, ... of `klear.rewards.code_prelude`); stdin programs run as written.
- rllm (``taco``, ``apps``, ``code_contests``, ``codeforces``, ``livecodebench``, ``leetcode``, ``kodcode``,
  ``primeintellect``, ``humanevalplus``, each optionally ``_longcot``): TACO/APPS/CodeContests ``{"inputs",
  "outputs", "fn_name"?}`` (with ``fn_name`` call-based: ``fn(*inputs[i])``, or ``Solution().fn``, equal to
  ``outputs[i]`` or to its first element); Codeforces ``[{"input", "output"}]``; LiveCodeBench ``[{"input",
  "output", "testtype", "metadata": {"func_name"}}]``; PrimeIntellect ``[{"input", "output", "fn_name"?,
  "type"}]``; LeetCode ``{"functional": "def check(candidate): ... check(Solution().f)"}``; KodCode a pytest file;
  HumanEval+ a test program (``inputs = [...]`` and its checks). Every program gets the import prelude, as rllm's
  runners prepend theirs; over `RLLM_MAX_TESTS` tests, the ones with the shortest inputs are kept, as rllm does.
- rllm's raw test files (``rllm/data/test/code/*.json``: a JSON list of ``{"problem", "tests", "solutions"?}``),
  read whole by `rllm_code_row`: ``tests`` is one of the layouts above (Codeforces' list, CodeContests' dict,
  LeetCode's ``functional``), or that value written as text (JSON, or a Python literal with single quotes, parsed
  by `literal_tests` and never run); the row's rllm source is told from the shape of its tests.
- klear's own tests (a list of ``{"input", "output"}``, ``{"fn_name", "args", "expected"}``, ``{"code"}``, or a
  suite ``{"tests", ...}``) pass through unchanged.

A layout klear cannot run (file-based tests, an unknown shape) raises ValueError naming what it is, so the row is
skipped at load time with its file and line.
"""

from __future__ import annotations

import ast
import contextlib
import json
from typing import Any

from klear.data.json_text import decode_json_text, parse_json

RLLM_SOURCES = (
    "taco",
    "apps",
    "code_contests",
    "codeforces",
    "livecodebench",
    "leetcode",
    "kodcode",
    "primeintellect",
    "humanevalplus",
)
"""rllm's code data sources (a ``_longcot`` suffix is the same source)."""
RLLM_MAX_TESTS = 32
"""rllm runs at most this many tests of a problem: those with the shortest inputs."""
_SUITE_KEYS = ("timeout", "max_test_cases")
_LCB_TEST_TYPES = ("stdin", "functional")
MAX_TESTS_CHARS = 64 << 20
"""Longest ``tests`` text `literal_tests` parses (Python's literal parser needs many times its input in memory)."""
CODE_R1_MAX_TESTS = 16
"""Code-R1 samples this many stdin tests or test programs per completion when a row sets no ``max_test_cases``."""


def rllm_source(source: str) -> str:
    """The rllm source ``source`` names (``taco_longcot`` -> ``taco``), or "" when it is not one."""
    base = source.removesuffix("_longcot")
    return base if base in RLLM_SOURCES else ""


def code_reference(value: Any, source: str = "") -> list[dict[str, Any]] | dict[str, Any]:
    """``value`` (a row's code reference, decoded from JSON when it is a JSON string) as the ``code`` reward's tests:
    a list of tests, or a suite ``{"tests", "prelude"?, "timeout"?, "max_test_cases"?}``. ValueError when its layout
    is not one klear can run."""
    value = decode_json_text(value)
    if isinstance(value, str) and value.lstrip().startswith('"'):  # rllm's json.dumps of a test program
        with contextlib.suppress(json.JSONDecodeError):  # else a program that starts with a string literal
            value = parse_json(value)
    rllm = rllm_source(source)
    if isinstance(value, str):
        if rllm == "kodcode":
            return _suite([{"pytest": value}], prelude=True)
        if rllm == "humanevalplus":
            return _suite([{"code": value}], prelude=True)
        raise ValueError(
            "code tests are a string that is not JSON (and the source is neither kodcode nor humanevalplus)"
        )
    if isinstance(value, list):
        return _listed(value, rllm)
    if isinstance(value, dict):
        return _keyed(value, rllm)
    raise ValueError(f"code tests are a {type(value).__name__}, not a list of tests or a test layout")


def _listed(tests: list, rllm: str) -> list[dict[str, Any]] | dict[str, Any]:
    if not tests or not all(isinstance(test, dict) for test in tests):
        raise ValueError("code tests must be a non-empty list of objects")
    first = tests[0]
    if "testtype" in first:  # LiveCodeBench through rllm
        converted = livecodebench_test_list(tests)
    elif "type" in first or ("fn_name" in first and "args" not in first):  # PrimeIntellect
        converted = _primeintellect(tests)
    else:
        converted = tests  # klear's own tests (Codeforces rows are stdin tests of this shape), checked by the reward
    if not rllm:
        return converted
    return _suite(_shortest(converted), prelude=True)


def _keyed(tests: dict, rllm: str) -> dict[str, Any]:
    if "tests" in tests:
        return tests  # klear's own suite (`klear.rewards.code_reward`), checked by the reward
    if "inputs_file" in tests or "outputs_file" in tests:
        raise ValueError("file-based tests (inputs_file / outputs_file) point at files klear does not read")
    options = {key: tests[key] for key in _SUITE_KEYS if key in tests}
    if not rllm:
        options.setdefault("max_test_cases", CODE_R1_MAX_TESTS)
    if "functional" in tests:
        programs = tests["functional"]
        programs = [programs] if isinstance(programs, str) else programs
        if not isinstance(programs, list) or not programs or not all(isinstance(p, str) for p in programs):
            raise ValueError("'functional' must be a test program or a non-empty list of them")
        return _suite([{"code": program} for program in programs], prelude=True, **options)
    if "pytest" in tests:
        if not isinstance(tests["pytest"], str):
            raise ValueError("'pytest' must be the source of a pytest file")
        return _suite([{"pytest": tests["pytest"]}], prelude=True, **options)
    if "inputs" in tests and "outputs" in tests:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError("'inputs' and 'outputs' must be lists of the same length")
        if not inputs:
            raise ValueError("no tests: 'inputs' is empty")
        fn_name = tests.get("fn_name")
        if fn_name:
            if not isinstance(fn_name, str) or not fn_name.isidentifier():
                raise ValueError(f"fn_name {fn_name!r} is not a Python name")
            calls = [_call(fn_name, args, want) for args, want in zip(inputs, outputs, strict=True)]
            return _suite(_shortest(calls) if rllm else calls, prelude=True, **options)
        join = "\n" if rllm else ", "  # rllm's runners join list-valued items by line, Code-R1 by ", "
        stdio = [
            {"input": _text(given, join), "output": _text(want, join)}
            for given, want in zip(inputs, outputs, strict=True)
        ]
        return _suite(_shortest(stdio), prelude=True, **options) if rllm else _suite(stdio, **options)
    raise ValueError(f"code tests with keys {sorted(tests)} are not a test layout klear knows")


def _primeintellect(tests: list[dict]) -> list[dict[str, Any]]:
    out = []
    for index, test in enumerate(tests):
        if "input" not in test or "output" not in test:
            raise ValueError(f"test {index} has no 'input' / 'output'")
        fn_name = test.get("fn_name")
        if fn_name:
            out.append(_call(fn_name, test["input"], test["output"]))
        else:
            out.append({"input": _text(test["input"], "\n"), "output": _text(test["output"], "\n")})
    return out


def _call(fn_name: str, args: Any, expected: Any) -> dict[str, Any]:
    if isinstance(args, str):  # some sets store the arguments as JSON text
        args = decode_json_text(args)
    if not isinstance(args, list):
        args = [args]
    return {"fn_name": fn_name, "args": args, "expected": expected, "or_first": True}


def _text(value: Any, join: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return join.join(map(str, value))
    return json.dumps(value) if not isinstance(value, int | float) else str(value)


def _shortest(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """rllm's cut: over `RLLM_MAX_TESTS` tests, the ones with the shortest inputs (stable)."""
    if len(tests) <= RLLM_MAX_TESTS:
        return tests

    def size(test: dict[str, Any]) -> int:
        return len(test["input"]) if "input" in test else len(json.dumps(test.get("args", "")))

    keep = sorted(range(len(tests)), key=lambda i: size(tests[i]))[:RLLM_MAX_TESTS]
    return [tests[i] for i in sorted(keep)]


def _suite(tests: list[dict[str, Any]], prelude: bool = False, **options: Any) -> dict[str, Any]:
    suite: dict[str, Any] = {"tests": tests}
    if prelude:
        from klear.rewards.code_prelude import BASE_PRELUDE, LEETCODE_PRELUDE

        suite["prelude"] = BASE_PRELUDE + "\n" + LEETCODE_PRELUDE
    suite.update(options)
    return suite


def is_taco_apps(row: dict) -> bool:
    """Whether ``row`` is a TACO or APPS row as their publishers ship it (``question`` and ``input_output``)."""
    return "question" in row and "input_output" in row


def is_code_contests(row: dict) -> bool:
    """Whether ``row`` is a CodeContests row (``deepmind/code_contests``: ``description`` and ``public_tests``)."""
    return "description" in row and isinstance(row.get("public_tests"), dict)


def taco_apps_row(row: dict) -> dict:
    """A TACO / APPS row (``BAAI/TACO``, ``codeparrot/apps``) as ``{"problem", "answer"}``: the question (and its
    starter code, when it has one) and ``input_output`` read as rllm reads it (stdin tests, or calls with
    ``fn_name``; the import prelude; the 32 tests with the shortest inputs)."""
    question, starter = row.get("question"), row.get("starter_code") or ""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("no text field 'question'")
    if not isinstance(starter, str):
        raise ValueError(f"starter_code is a {type(starter).__name__}, not a string")
    problem = question.strip() + (
        f"\n\nUse this starter code:\n```python\n{starter.rstrip()}\n```" if starter.strip() else ""
    )
    return {"problem": problem, "answer": code_reference(row["input_output"], "taco")}


def code_contests_row(row: dict) -> dict:
    """A CodeContests row as ``{"problem", "answer"}``: the description, and its public, private and generated
    tests (in that order) as stdin tests."""
    description = row.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("no text field 'description'")
    tests = []
    for kind in ("public_tests", "private_tests", "generated_tests"):
        group = row.get(kind) or {"input": [], "output": []}
        inputs, outputs = group.get("input"), group.get("output")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError(f"{kind} must hold 'input' and 'output' lists of the same length")
        tests += [{"input": _text(i, "\n"), "output": _text(o, "\n")} for i, o in zip(inputs, outputs, strict=True)]
    if not tests:
        raise ValueError("no tests: public_tests, private_tests and generated_tests are all empty")
    return {"problem": description.strip(), "answer": tests}


def is_rllm_code(row: dict) -> bool:
    """Whether ``row`` is a row of rllm's raw code files (``problem`` and ``tests``, no ``answer``)."""
    return "problem" in row and "tests" in row and "answer" not in row


def rllm_code_row(row: dict) -> dict:
    """A row of rllm's raw code files as ``{"problem", "answer", "data_source"}``: the tests as a value (read by
    `literal_tests` when they are text) and the rllm source their shape names (`rllm_shape_source`), through which
    `code_reference` reads them and the row routes to rllm's scoring."""
    problem = row.get("problem")
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError("no text field 'problem'")
    tests = literal_tests(row["tests"])
    return {"problem": problem, "answer": tests, "data_source": rllm_shape_source(tests)}


def literal_tests(value: Any) -> Any:
    """``value`` when it is not text; text holding a JSON value or a Python literal (``"[{'input': ...}]"``) parsed
    without running anything (`ast.literal_eval` builds literals only), up to `MAX_TESTS_CHARS` characters.
    ValueError for empty tests and for text that is neither."""
    if _empty(value):
        raise ValueError("no tests: 'tests' is empty")
    if not isinstance(value, str):
        return value
    if len(value) > MAX_TESTS_CHARS:
        raise ValueError(f"'tests' is {len(value)} characters of text, over the {MAX_TESTS_CHARS} this reader parses")
    text = value.strip()
    with contextlib.suppress(json.JSONDecodeError, RecursionError):
        return parse_json(text)
    try:
        parsed = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else type(error).__name__
        reason = "it holds names or calls, not only literals" if isinstance(error, ValueError) else reason
        raise ValueError(f"'tests' is text that is neither JSON nor a Python literal ({reason})") from None
    if _empty(parsed):
        raise ValueError("no tests: 'tests' is empty")
    return parsed


def _empty(value: Any) -> bool:
    return (
        value is None
        or (isinstance(value, str) and not value.strip())
        or (isinstance(value, list | dict) and not value)
    )


def rllm_shape_source(tests: Any) -> str:
    """The rllm source whose test file has ``tests``' shape: ``leetcode`` (``{"functional"}``), ``code_contests``
    (``{"inputs", "outputs"}``, which rllm checks as TACO's and APPS'), ``livecodebench`` (tests with
    ``testtype``), ``primeintellect`` (with ``type``), ``codeforces`` (other lists of tests). ValueError otherwise."""
    if isinstance(tests, dict):
        if "functional" in tests:
            return "leetcode"
        if "inputs" in tests and "outputs" in tests:
            return "code_contests"
        raise ValueError(f"tests with keys {sorted(tests)[:8]} are not a test layout of rllm's code files")
    if isinstance(tests, list) and tests and all(isinstance(test, dict) for test in tests):
        if "testtype" in tests[0]:
            return "livecodebench"
        return "primeintellect" if "type" in tests[0] else "codeforces"
    raise ValueError(f"tests are a {type(tests).__name__}, not a list of tests or a test layout of rllm's code files")


def livecodebench_test_list(tests: list[dict]) -> list[dict]:
    """LiveCodeBench tests as rllm stores them (a list of ``{"input", "output", "testtype", "metadata"}``, the
    function name in the first test's ``metadata.func_name``) in the ``code`` reward's format."""
    functional = any(test.get("testtype") == "functional" for test in tests)
    fn_name = lcb_func_name(tests[0]) if functional else None
    return [lcb_test(test, fn_name, f"test {index}") for index, test in enumerate(tests)]


def lcb_test(test: dict, fn_name: str | None, where: str) -> dict:
    """One LiveCodeBench test (``{"input", "output", "testtype"}``) in the ``code`` reward's format: a stdin test as
    ``{"input", "output"}``, a functional one as ``{"fn_name", "args", "expected"}`` (one JSON value per input line)."""
    kind, given, output = test.get("testtype"), test.get("input"), test.get("output")
    if kind not in _LCB_TEST_TYPES:
        raise ValueError(f"{where}: testtype {kind!r} is not one of {list(_LCB_TEST_TYPES)}")
    if not isinstance(given, str) or not isinstance(output, str):
        raise ValueError(f"{where}: 'input' and 'output' must be strings")
    if kind == "stdin":
        return {"input": given, "output": output}
    try:
        args = [parse_json(line) for line in given.split("\n")]
        expected = parse_json(output)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: a functional input line or output is not JSON ({error.msg})") from None
    return {"fn_name": fn_name, "args": args, "expected": expected}


def lcb_func_name(row: dict) -> str:
    """The function a LiveCodeBench row's functional tests call: ``metadata.func_name`` (a dict or JSON text)."""
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = parse_json(metadata)
        except json.JSONDecodeError as error:
            raise ValueError(f"metadata is not valid JSON ({error.msg})") from None
    name = metadata.get("func_name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"functional tests but metadata has no func_name naming a function (got {name!r})")
    return name
