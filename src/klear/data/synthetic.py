"""The built-in reasoning task: chains of arithmetic steps whose answer is checked from the final ``\\boxed{}``.

A problem reads "Start with 7. Add 5, then multiply by 3, then subtract 4." and its reference solution is the chain
of intermediate results inside think tags, in the same format as real long chain-of-thought data::

    <think>
    7 + 5 = 12
    12 * 3 = 36
    36 - 4 = 32
    </think>

    The answer is \\boxed{32}.

Writing the chain is what makes the task solvable for a small model: each line is one bounded operation on
numbers it has just written, while the answer alone would need the whole computation in one forward pass.
What was simplified, and why:
- every value stays in ``0..99`` (an operation that would leave that range is not drawn) and multipliers are
  single digits, so a character-level model of ~0.4M parameters learns the steps in a couple of CPU minutes;
  solutions stay under ~85 tokens, which keeps RL rollouts on a CPU fast;
- difficulty has two axes, the number of steps and the size of added or subtracted operands (``LEVELS``).
  Per-step errors compound along the chain, and two-digit operands (carries and borrows across both digits)
  are learned last, so after the default SFT the levels sit around 55/45/35/25% greedy accuracy (mean of
  five seeds) and RL has headroom on all of them (the eval of ``configs/sft.yaml`` shows it);
- the prompt has no formatting instruction ("put the answer in \\boxed{}"): the format is learned in SFT,
  and the shorter prompt keeps training and rollouts cheap. `sft_rows` can state a share of the answers
  plainly instead (``plain_fraction``), as mixed distilled corpora do; the verifier rejects those, which is
  what the default SFT -> RL pipeline shows RL correcting.

Train and eval problems are disjoint by construction: a problem's split is a hash of its text, and each split's
generator keeps only the problems that hash into it. The same text can therefore never be in both, whatever the
seeds or sizes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MAX_VALUE = 99
"""Every start value, intermediate result and answer lies in ``0..MAX_VALUE``."""
MAX_START = 20
"""Start values are drawn from ``1..MAX_START``."""
MAX_MULTIPLIER = 9
"""Multipliers are ``2..MAX_MULTIPLIER`` at every level."""
EVAL_PERCENT = 10
"""Share of the problem space (by text hash) reserved for the eval split."""
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Level:
    """One difficulty: how many operations the chain has and how large added/subtracted operands get."""

    steps: int
    max_operand: int


LEVELS: dict[int, Level] = {
    1: Level(steps=2, max_operand=9),
    2: Level(steps=3, max_operand=9),
    3: Level(steps=3, max_operand=49),
    4: Level(steps=4, max_operand=49),
}
DEFAULT_LEVELS = (1, 2, 3, 4)
"""The mix the embedded default trains and evaluates on, one level per problem in turn."""

_SYMBOL = {"add": "+", "subtract": "-", "multiply": "*"}
_PHRASE = {"add": "add {}", "subtract": "subtract {}", "multiply": "multiply by {}"}


def split_of(problem: str) -> str:
    """The split (``"train"`` or ``"eval"``) a problem text belongs to, fixed by a hash of the text."""
    bucket = int.from_bytes(hashlib.sha256(problem.encode()).digest()[:8], "big") % 100
    return "eval" if bucket < EVAL_PERCENT else "train"


def make_problem(rng: random.Random, level: int) -> dict:
    """Draw one problem of ``level`` (a key of ``LEVELS``), whatever split its text hashes into.

    Returns ``{"problem", "answer", "solution", "level"}``; ``answer`` is the final value as a string.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level}; expected one of {sorted(LEVELS)}")
    spec = LEVELS[level]
    value = rng.randint(1, MAX_START)
    start, phrases, lines = value, [], []
    for _ in range(spec.steps):
        op, operand = _draw_step(rng, value, spec.max_operand)
        result = {"add": value + operand, "subtract": value - operand, "multiply": value * operand}[op]
        phrases.append(_PHRASE[op].format(operand))
        lines.append(f"{value} {_SYMBOL[op]} {operand} = {result}")
        value = result
    steps_text = ", then ".join(phrases)
    problem = f"Start with {start}. {steps_text[0].upper()}{steps_text[1:]}."
    think = "\n".join(lines)
    solution = f"<think>\n{think}\n</think>\n\nThe answer is \\boxed{{{value}}}."
    return {"problem": problem, "answer": str(value), "solution": solution, "level": level}


def generate_problems(n: int, *, split: str = "train", seed: int = 0, levels: Sequence[int] = DEFAULT_LEVELS) -> list:
    """``n`` problems of ``split``, levels in round-robin order (so every level gets ``n / len(levels)``).

    Deterministic in ``(n, split, seed, levels)``; a longer list starts with the shorter one. Problems may repeat
    within a split (the space of short chains is small), never across splits.
    """
    return draw_split(make_problem, n, split, random.Random(f"klear-synthetic-{seed}-{split}"), levels, LEVELS)


def draw_split(
    make: Callable[[random.Random, int], dict],
    n: int,
    split: str,
    rng: random.Random,
    levels: Sequence[int],
    known: Mapping[int, object],
) -> list[dict]:
    """``n`` records ``make(rng, level)`` of ``split``, levels in turn, each redrawn until its text hashes into
    ``split``: what keeps the splits of a built-in task disjoint (this task's and the code task's)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if not levels:
        raise ValueError("levels is empty; pass at least one of " + str(sorted(known)))
    records = []
    for i in range(n):
        record = make(rng, levels[i % len(levels)])
        while split_of(record["problem"]) != split:
            record = make(rng, levels[i % len(levels)])
        records.append(record)
    return records


def to_chat(record: dict, solution: str | None = None) -> dict:
    """The record as a two-turn conversation: the problem from the user, the solution from the assistant."""
    return {
        "messages": [
            {"role": "user", "content": record["problem"]},
            {"role": "assistant", "content": record["solution"] if solution is None else solution},
        ]
    }


def plain_solution(record: dict) -> str:
    """The reference solution with its final answer stated plainly instead of in ``\\boxed{}``."""
    return record["solution"].replace(f"\\boxed{{{record['answer']}}}", record["answer"])


def sft_rows(
    records: Sequence[dict],
    plain_fraction: float = 0.0,
    seed: int = 0,
    plain: Callable[[dict], str] = plain_solution,
) -> list[dict]:
    """Chat rows for SFT; a seeded ``plain_fraction`` of them use the solution ``plain(record)`` writes instead:
    by default the final answer stated without ``\\boxed{}``.

    Distilled long-CoT corpora mix answer styles, and the math verifier accepts only a boxed answer (as in the
    paper). An SFT model trained on the mix writes the unboxed style about as often as its data did and loses
    those answers to the verifier, however right they are: the first thing RL against the verifier corrects,
    before it sharpens the arithmetic itself. (The code task's ``plain`` prints its result with a label, which
    stdout tests reject in the same way.)
    """
    if not 0.0 <= plain_fraction <= 1.0:
        raise ValueError(f"plain_fraction must be in [0, 1], got {plain_fraction}")
    rng = random.Random(f"klear-synthetic-styles-{seed}")
    return [to_chat(record, plain(record) if rng.random() < plain_fraction else None) for record in records]


def _draw_step(rng: random.Random, value: int, max_operand: int) -> tuple[str, int]:
    """An operation and operand keeping the result in ``0..MAX_VALUE``; never a multiplication by 0 or 1, or of 0."""
    choices = {
        "add": range(1, min(max_operand, MAX_VALUE - value) + 1),
        "subtract": range(1, min(max_operand, value) + 1),
        "multiply": range(2, min(MAX_MULTIPLIER, MAX_VALUE // value) + 1) if value else range(0),
    }
    feasible = [op for op, operands in choices.items() if len(operands) > 0]
    op = rng.choice(feasible)
    return op, rng.choice(choices[op])
