"""The built-in programming task: short stdin/stdout programs, checked by running them on tests in the sandbox.

A problem reads "Read integers a and b from one line. Start with b, add 7, then multiply by a, then subtract b.
Print the result." Its reference solution is one fenced python program, one line per step, and it comes with
``NUM_TESTS`` stdin/stdout tests drawn at random (the program must be right for every input, not one)::

    ```python
    a, b = map(int, input().split())
    x = b
    x = x + 7
    x = x * a
    x = x - b
    print(x)
    ```

It is the code counterpart of the arithmetic task (:mod:`klear.data.synthetic`), built the same way for the same
reason: the embedded default must run code RL end to end — sampling programs, running them in the real sandbox,
scoring the pass fraction — on a laptop CPU in minutes, with a model of ~0.4M parameters. What was simplified:

- the programs are straight-line integer arithmetic over the inputs: each sentence of the problem maps to one
  line of code, so the task is a translation a tiny byte-level model can learn, while its errors (a wrong
  variable, a wrong operator, a dropped step, a mistyped constant, a wrong input line) make programs fail;
- difficulty has two axes, the number of inputs (which decides the input line) and the number of steps
  (``LEVELS``); constants are small so that each is one or two tokens;
- the tests are random inputs in ``0..MAX_INPUT``, so a program that only works for some inputs gets a partial
  pass fraction (``x * a`` and ``x + a`` agree when ``a`` is 2 and ``x`` is 2): the soft code reward sees a
  difference there that the hard one does not;
- as in the arithmetic task, SFT data can mix in an output style the verifier rejects (`labelled_solution`:
  ``print("Result:", x)``, a classic way for a right program to fail stdout tests), which is what RL against
  the tests corrects first. Without it, the tiny model's remaining errors are mistyped constants, which SFT
  fixes abruptly with more steps and RL at a safe learning rate hardly moves.

Train and eval problems are disjoint by a hash of their text, as in the arithmetic task (`split_of`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from klear.data.synthetic import draw_split

NUM_TESTS = 4
"""stdin/stdout tests per problem."""
MAX_INPUT = 20
"""Test inputs are drawn from ``0..MAX_INPUT``."""
MAX_CONSTANT = 9
"""Constants of a step are drawn from ``2..MAX_CONSTANT`` (levels 3 and 4: up to ``2 * MAX_CONSTANT + 1``)."""
NAMES = ("a", "b", "c")


@dataclass(frozen=True)
class CodeLevel:
    """One difficulty: how many integers the program reads and how many steps it computes."""

    inputs: int
    steps: int
    max_constant: int


LEVELS: dict[int, CodeLevel] = {
    1: CodeLevel(inputs=1, steps=2, max_constant=MAX_CONSTANT),
    2: CodeLevel(inputs=2, steps=2, max_constant=MAX_CONSTANT),
    3: CodeLevel(inputs=2, steps=3, max_constant=2 * MAX_CONSTANT + 1),
    4: CodeLevel(inputs=3, steps=4, max_constant=2 * MAX_CONSTANT + 1),
}
DEFAULT_LEVELS = (1, 2, 3, 4)

_SYMBOL = {"add": "+", "subtract": "-", "multiply": "*"}
_PHRASE = {"add": "add {}", "subtract": "subtract {}", "multiply": "multiply by {}"}
_READ = {
    1: ("Read an integer a.", "a = int(input())"),
    2: ("Read integers a and b from one line.", "a, b = map(int, input().split())"),
    3: ("Read integers a, b and c from one line.", "a, b, c = map(int, input().split())"),
}


def make_code_problem(rng: random.Random, level: int) -> dict:
    """One problem of ``level``: ``{"problem", "answer": tests, "solution", "level"}``, whatever its split."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level}; expected one of {sorted(LEVELS)}")
    spec = LEVELS[level]
    names = NAMES[: spec.inputs]
    start = rng.choice(names)
    steps = [_draw_step(rng, names, spec.max_constant) for _ in range(spec.steps)]
    phrases = ", then ".join(_PHRASE[op].format(operand) for op, operand in steps)
    read_text, read_code = _READ[spec.inputs]
    problem = f"{read_text} Start with {start}, {phrases}. Print the result."
    lines = [read_code, f"x = {start}", *(f"x = x {_SYMBOL[op]} {operand}" for op, operand in steps), "print(x)"]
    solution = "```python\n" + "\n".join(lines) + "\n```"
    tests = []
    for _ in range(NUM_TESTS):
        values = {name: rng.randint(0, MAX_INPUT) for name in names}
        tests.append(
            {"input": " ".join(str(values[name]) for name in names) + "\n", "output": f"{_run(start, steps, values)}\n"}
        )
    return {"problem": problem, "answer": tests, "solution": solution, "level": level}


def generate_code_problems(
    n: int, *, split: str = "train", seed: int = 0, levels: Sequence[int] = DEFAULT_LEVELS
) -> list[dict]:
    """``n`` problems of ``split``, levels in round-robin order; deterministic in ``(n, split, seed, levels)``."""
    rng = random.Random(f"klear-synthetic-code-{seed}-{split}")
    return draw_split(make_code_problem, n, split, rng, levels, LEVELS)


def labelled_solution(record: dict) -> str:
    """The reference program printing its result with a label (``print("Result:", x)``), which every stdout test
    rejects: the code task's counterpart of an unboxed math answer (`klear.data.synthetic.sft_rows`)."""
    return record["solution"].replace("\nprint(x)\n", '\nprint("Result:", x)\n')


def _draw_step(rng: random.Random, names: Sequence[str], max_constant: int) -> tuple[str, str]:
    """An operation and its operand: an input name (a third of the time, when there is one) or a constant."""
    op = rng.choice(("add", "subtract", "multiply"))
    operand = rng.choice(names) if rng.random() < 1 / 3 else str(rng.randint(2, max_constant))
    return op, operand


def _run(start: str, steps: Sequence[tuple[str, str]], values: dict[str, int]) -> int:
    x = values[start]
    for op, operand in steps:
        y = values[operand] if operand in values else int(operand)
        x = {"add": x + y, "subtract": x - y, "multiply": x * y}[op]
    return x
