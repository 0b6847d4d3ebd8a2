"""Public code benchmarks as klear code rows: LiveCodeBench, HumanEval, MBPP and LeetCodeDataset.

Each converter turns one benchmark row into ``{"problem": <prompt text>, "answer": [tests], ...}``, the tests
in the ``code`` reward's format (`klear.rewards.code_reward`), which is what klear's RL and eval read from code
rows by default. `code_row` picks the converter from the row's fields; `code_rows` converts a numbered file
(`klear.data.readers.read_numbered`) and turns each row it cannot convert into a `BadRow` naming file and line.

- LiveCodeBench (``livecodebench/code_generation_lite``, any release_v1..v6 file): stdin tests become
  ``{"input", "output"}``; functional (LeetCode) tests become ``{"fn_name", "args", "expected"}``, the input's
  lines read as one JSON value per argument and the output as one JSON value, as LiveCodeBench's own grader reads
  them. Public tests come first, then private ones. The prompt keeps LiveCodeBench's generic chat template
  (``### Question:`` / ``### Format:`` / ``### Answer:``) and its two format instructions, so scores stay close to
  the published ones, with one change: LiveCodeBench's grader prepends ``from typing import *`` and a dozen
  other star imports to every program, the ``code`` reward runs the program as written, so both instructions ask
  for every import the code needs (a LeetCode starter code names ``List`` without importing it). LiveCodeBench's
  system message is not included: klear rows hold the user turn only (pass it as the run's system prompt).
  LiveCodeBench also accepts numerically equal tokens on a stdin line (``1.50`` for ``1.5``), the ``code``
  reward compares the stripped text of each line, so such a program passes there and fails here (rare).
- HumanEval (``openai_humaneval``): one test, ``{"code": test + "check(<entry_point>)"}``, which passes when
  the completion's program and then that code run without an exception. The prompt asks for the whole program
  (the imports and helper functions the signature comes with, and the completed function) in one block, since
  the reward runs the completion alone rather than appended to the prompt as HumanEval's harness does.
- LeetCodeDataset (``newfacade/LeetCodeDataset``, the source of Code-R1's and rllm's LeetCode rows): its
  ``query`` is the prompt, and one test program ``test + check(entry_point)`` runs after the solution with the
  row's ``prompt`` (the dataset's import prelude) as the suite's prelude.
- TACO / APPS and CodeContests rows as their publishers ship them, and rllm's raw code files, are read by
  `klear.data.code_layouts`.
- MBPP (``mbpp`` full, ``text`` / ``test_setup_code``, or sanitized, ``prompt`` / ``test_imports``): one
  ``{"code": setup + assert}`` test per entry of ``test_list``; the prompt is MBPP's own ("here is your task:
  ... Your code should pass these tests"), shortened to the first assert, which shows the function's name and
  signature. ``challenge_test_list`` is left out: MBPP's standard evaluation uses ``test_list`` only.

LiveCodeBench's lite release stores private tests as base64 of zlib-compressed data of a pickle of the JSON
string. Unpickling runs code of the data's choosing, so `decode_lcb_tests` never unpickles blindly: it decodes
base64 strictly, decompresses to at most `MAX_DECOMPRESSED_BYTES` (a zip-bomb guard), scans the pickle's opcodes
and refuses any outside the few that make a ``str`` (no GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
PERSID, EXT..., nor lists or dicts), only then unpickles with an unpickler that refuses every global and
persistent id, and checks that the result is a ``str`` before reading it as JSON.

A row that cannot be converted (no tests, a functional problem without ``func_name``, undecodable tests, a
missing field) raises ValueError with one line saying why; nothing is dropped or guessed silently.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import pickletools
import zlib
from collections.abc import Callable
from datetime import date
from typing import Any

from klear.data.code_layouts import (
    code_contests_row,
    is_code_contests,
    is_rllm_code,
    is_taco_apps,
    lcb_func_name,
    lcb_test,
    rllm_code_row,
    taco_apps_row,
)
from klear.data.json_text import parse_json
from klear.data.readers import BadRow

MAX_DECOMPRESSED_BYTES = 512 << 20
"""Most bytes a compressed LiveCodeBench test field may inflate to (the largest real ones are far smaller)."""

LCB_STDIN_FORMAT = (
    "Read the inputs from stdin, solve the problem and write the answer to stdout (do not directly test on the "
    "sample inputs). Write a complete program, with every import it needs, and enclose it within delimiters as "
    "follows."
)
LCB_STARTER_FORMAT = (
    "You will use the following starter code to write the solution to the problem and enclose your code within "
    "delimiters. Include every import your code needs (such as `from typing import List`): nothing is imported "
    "for you."
)
LCB_ANSWER = "### Answer: (use the provided format with backticks)"
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole program in one ```python block: the imports "
    "and any helper functions shown here, and the function with its body written."
)
MBPP_INSTRUCTION = "Write the function, with every import it needs, in one ```python block."

_STR_PICKLE_OPCODES = frozenset(
    {"PROTO", "FRAME", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
    | {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "STOP"}
)
"""The opcodes of a pickled ``str`` in protocols 0-5: the string, its memo entry, framing and STOP."""


def is_livecodebench(row: dict) -> bool:
    """Whether ``row`` is a LiveCodeBench code-generation row (it has question_content and public_test_cases)."""
    return "question_content" in row and "public_test_cases" in row


def is_leetcodedataset(row: dict) -> bool:
    """Whether ``row`` is a LeetCodeDataset row (newfacade/LeetCodeDataset: query, test, entry_point, prompt)."""
    return all(key in row for key in ("query", "test", "entry_point", "prompt"))


def is_humaneval(row: dict) -> bool:
    """Whether ``row`` is a HumanEval row (it has prompt, test and entry_point, and is no LeetCodeDataset row)."""
    return all(key in row for key in ("prompt", "test", "entry_point")) and not is_leetcodedataset(row)


def is_mbpp(row: dict) -> bool:
    """Whether ``row`` is an MBPP row, full or sanitized (it has test_list and text or prompt)."""
    return "test_list" in row and ("text" in row or "prompt" in row)


def benchmark_layout(row: dict) -> str | None:
    """The name of the code-set layout whose converter `code_row` applies to ``row`` (`CONVERTERS`), or None."""
    return next((name for name, (matches, _) in CONVERTERS.items() if matches(row)), None)


def code_row(row: dict) -> dict:
    """``row`` as a klear code row by whichever layout of `CONVERTERS` its fields match."""
    name = benchmark_layout(row)
    if name is None:
        kinds = "LiveCodeBench, HumanEval, MBPP, LeetCodeDataset, TACO/APPS, CodeContests or rllm code"
        raise ValueError(f"not a {kinds} row (fields: {sorted(row)})")
    return CONVERTERS[name][1](row)


def code_rows(rows: list[tuple[int, dict]], path: str, bad: list[BadRow]) -> list[dict]:
    """`code_row` of each ``(line, row)``; a row it cannot convert is appended to ``bad`` with its line."""
    out = []
    for line, row in rows:
        try:
            out.append(code_row(row))
        except ValueError as error:
            bad.append(BadRow(path, line, str(error)))
    return out


def livecodebench_row(row: dict, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> dict:
    """A LiveCodeBench row as ``{"problem", "answer", "question_id", "difficulty", "platform", "contest_date"}``.

    ``max_bytes`` bounds what a compressed private-test field may decompress to (`decode_lcb_tests`).
    """
    content = _text(row, "question_content")
    starter = row.get("starter_code", "")
    if not isinstance(starter, str):
        raise ValueError(f"starter_code is a {type(starter).__name__}, not a string")
    if starter.strip():
        fmt = f"### Format: {LCB_STARTER_FORMAT}\n```python\n{starter.rstrip()}\n```"
    else:
        fmt = f"### Format: {LCB_STDIN_FORMAT}\n```python\n# YOUR CODE HERE\n```"
    contest_date = row.get("contest_date")
    return {
        "problem": f"### Question:\n{content.strip()}\n\n{fmt}\n\n{LCB_ANSWER}",
        "answer": livecodebench_tests(row, max_bytes),
        "question_id": row.get("question_id"),
        "difficulty": row.get("difficulty"),
        "platform": row.get("platform"),
        "contest_date": contest_date.isoformat() if isinstance(contest_date, date) else contest_date,
    }


def livecodebench_tests(row: dict, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> list[dict]:
    """A LiveCodeBench row's public then private tests in the ``code`` reward's format."""
    for key in ("public_test_cases", "private_test_cases"):
        if key not in row:
            raise ValueError(f"no {key} field")
    raw = [("public", test) for test in decode_lcb_tests(row["public_test_cases"], max_bytes)]
    raw += [("private", test) for test in decode_lcb_tests(row["private_test_cases"], max_bytes)]
    if not raw:
        raise ValueError("no tests: public_test_cases and private_test_cases are both empty")
    fn_name = lcb_func_name(row) if any(test.get("testtype") == "functional" for _, test in raw) else None
    tests, counts = [], {"public": 0, "private": 0}
    for kind, test in raw:
        where = f"{kind} test {counts[kind]}"
        counts[kind] += 1
        tests.append(lcb_test(test, fn_name, where))
    return tests


def decode_lcb_tests(value: Any, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> list[dict]:
    """A LiveCodeBench test field as its list of test dicts.

    The field is a JSON string (``"[{...}]"``), a compressed string (base64 of zlib of a pickled JSON string,
    decoded safely as the module docstring describes), or an already decoded list.
    """
    if isinstance(value, list):
        tests = value
    elif isinstance(value, str):
        text = value if value.lstrip().startswith("[") else unpack_compressed_str(value, max_bytes)
        try:
            tests = parse_json(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"test cases are not valid JSON ({error.msg} at column {error.colno})") from None
    else:
        raise ValueError(f"test cases are a {type(value).__name__}, not a JSON or compressed string")
    if not isinstance(tests, list) or not all(isinstance(test, dict) for test in tests):
        raise ValueError("test cases are not a list of objects")
    return tests


def unpack_compressed_str(text: str, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> str:
    """The ``str`` in ``base64(zlib(pickle(str)))``, without ever running code the pickle asks for.

    Raises ValueError for bad base64, bad or truncated zlib data, more than ``max_bytes`` once decompressed, or
    a pickle holding anything but one string.
    """
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"compressed test cases are not valid base64 ({error})") from None
    return _unpickle_str(_inflate(data, max_bytes))


def humaneval_row(row: dict) -> dict:
    """A HumanEval row as ``{"problem", "answer": [{"code": test + check(entry_point)}], "task_id"}``."""
    prompt, test, entry_point = (_text(row, key) for key in ("prompt", "test", "entry_point"))
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python name")
    return {
        "problem": f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```",
        "answer": [{"code": test + f"\ncheck({entry_point})\n"}],
        "task_id": row.get("task_id"),
    }


def leetcodedataset_row(row: dict) -> dict:
    """A LeetCodeDataset row as ``{"problem": query, "answer": {"tests": [{"code": test + check(entry_point)}],
    "prelude": prompt}, "task_id"}``: its ``prompt`` is the import prelude its solutions rely on, and a solution
    passes when ``prompt + solution + test + check(entry_point)`` runs, as the dataset's own evaluation does."""
    query, prelude, test, entry_point = (_text(row, key) for key in ("query", "prompt", "test", "entry_point"))
    if not all(part.isidentifier() for part in entry_point.replace("()", "").split(".")):
        raise ValueError(f"entry_point {entry_point!r} is not a Python name or Solution().method")
    suite = {"tests": [{"code": test + f"\ncheck({entry_point})\n"}], "prelude": prelude}
    return {"problem": query, "answer": suite, "task_id": row.get("task_id")}


def mbpp_row(row: dict) -> dict:
    """An MBPP row as ``{"problem", "answer": [{"code": setup + assert}, ...], "task_id"}``."""
    text = _text(row, "text" if "text" in row else "prompt")
    asserts = row.get("test_list")
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
        raise ValueError("test_list is not a non-empty list of strings")
    setup = _mbpp_setup(row)
    problem = (
        f"You are an expert Python programmer, and here is your task: {text.strip()} "
        f"Your code should pass this test:\n\n{asserts[0].strip()}\n\n{MBPP_INSTRUCTION}"
    )
    return {"problem": problem, "answer": [{"code": setup + "\n" + a} for a in asserts], "task_id": row.get("task_id")}


def _mbpp_setup(row: dict) -> str:
    """The code the asserts need first: full MBPP's ``test_setup_code``, sanitized MBPP's ``test_imports``."""
    if "test_setup_code" in row:
        return _text(row, "test_setup_code")
    imports = row.get("test_imports", [])
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise ValueError("test_imports is not a list of strings")
    return "\n".join(imports)


def _inflate(data: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as error:
        raise ValueError(f"compressed test cases are not valid zlib data ({error})") from None
    if len(out) > max_bytes:
        raise ValueError(f"compressed test cases decompress to more than {max_bytes} bytes (the limit)")
    if not inflater.eof:
        raise ValueError("compressed test cases are truncated zlib data")
    if inflater.unused_data:
        raise ValueError("compressed test cases have bytes after the end of the zlib data")
    return out


def _unpickle_str(data: bytes) -> str:
    last = -1
    try:
        for opcode, _arg, position in pickletools.genops(data):
            if opcode.name not in _STR_PICKLE_OPCODES:
                raise ValueError(f"the pickle has opcode {opcode.name} at byte {position}; only a str is accepted")
            last = position
    except ValueError as error:
        raise ValueError(f"compressed test cases refused: {error}") from None
    if last != len(data) - 1:
        raise ValueError("compressed test cases refused: bytes after the pickle's STOP")
    try:
        value = _StrUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, ValueError, EOFError) as error:
        raise ValueError(f"compressed test cases refused: {error}") from None
    if not isinstance(value, str):
        raise ValueError(f"compressed test cases refused: the pickle holds a {type(value).__name__}, not a str")
    return value


class _StrUnpickler(pickle.Unpickler):
    """An unpickler that loads no class or function and no persistent object: plain data only."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent id refused")


CONVERTERS: dict[str, tuple[Callable[[dict], bool], Callable[[dict], dict]]] = {
    "livecodebench": (is_livecodebench, livecodebench_row),
    "humaneval": (is_humaneval, humaneval_row),
    "mbpp": (is_mbpp, mbpp_row),
    "leetcodedataset": (is_leetcodedataset, leetcodedataset_row),
    "taco-apps": (is_taco_apps, taco_apps_row),
    "code-contests": (is_code_contests, code_contests_row),
    "rllm-code": (is_rllm_code, rllm_code_row),
}
"""Layout name -> (does a row have it, its converter), tried in this order: the code sets read whole."""

CODE_CONTESTS_PYTHON3 = 3
"""CodeContests' ``solutions.language`` value for Python 3 (its ``Language`` enum: 1 is Python 2, 2 C++, 4 Java)."""
SOLUTION_FIELDS = {
    "humaneval": "prompt + canonical_solution",
    "mbpp": "code",
    "leetcodedataset": "completion",
    "taco-apps": "solutions.0",
    "code-contests": "the first Python 3 program of solutions",
    "rllm-code": "solutions",
}
"""Where each code set's publisher ships a reference solution, as `published_solution` reads it."""


def published_solution(row: dict) -> str | None:
    """The reference solution a code set's publisher ships in ``row``, as a whole program (`SOLUTION_FIELDS`):
    HumanEval's signature and docstring with its canonical body, MBPP's ``code``, LeetCodeDataset's ``completion``
    (its ``prompt`` prelude runs before it, as the tests' suite says), the first of TACO / APPS' ``solutions`` (a
    JSON list as text), CodeContests' first Python 3 program, rllm's ``solutions`` (a text, or the first of a list).
    None when the row is in none of these layouts or ships no solution."""
    layout = benchmark_layout(row)
    if layout == "humaneval":
        prompt, body = row.get("prompt"), row.get("canonical_solution")
        return prompt + body if isinstance(prompt, str) and isinstance(body, str) else None
    if layout in ("mbpp", "leetcodedataset"):
        value = row.get("code" if layout == "mbpp" else "completion")
        return value if isinstance(value, str) else None
    if layout == "code-contests":
        solutions = row.get("solutions")
        if not isinstance(solutions, dict):
            return None
        pairs = zip(solutions.get("language") or [], solutions.get("solution") or [], strict=False)
        return next((code for language, code in pairs if language == CODE_CONTESTS_PYTHON3), None)
    if layout in ("taco-apps", "rllm-code"):
        solutions = row.get("solutions")
        if layout == "taco-apps" and isinstance(solutions, str):
            try:
                solutions = json.loads(solutions)
            except ValueError:
                return None
        if isinstance(solutions, list):
            solutions = next((code for code in solutions if isinstance(code, str)), None)
        return solutions if isinstance(solutions, str) and solutions.strip() else None
    return None


def _text(row: dict, key: str) -> str:
    if not isinstance(row.get(key), str):
        raise ValueError(f"no text field {key!r} (fields: {sorted(row)})")
    return row[key]
