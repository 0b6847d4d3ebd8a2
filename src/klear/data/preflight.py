"""The run's data checked before anything heavy is imported: what ``klear.fit`` can say about its data files in a
second, it says in a second.

Everything about a data file that needs no tokenizer is checked here: that it exists and parses, its layout
(detected from its first row, or the fields ``data.prompt_key`` / ``data.reference_key`` name), every row's
reference and route (`klear.data.problems.load_problems`, the loader the stage calls later). A source with no usable
row stops the run with one line (`DataError`); bad rows are left for the stage to warn about and count, once. What
needs the tokenizer (prompt lengths) comes after the model is loaded.

A JSON-lines file is read a part at a time (`klear.data.row_parts.RowParts`): the check holds no more of its rows
than a part. Each row is read and checked once: with ``keep`` (``klear.fit``'s preflight), a problem file's checked
problems are kept (`kept_problems`) for the stage, which then only measures their prompts, and an SFT file's rows
are kept (`klear.data.readers.keep_read`) for its own read. A kept set is served once, to a load of the same
unchanged file in the same way (split, task, reward and prompt format), and holds no copy of its rows. The built-in
synthetic tasks are generated, not read: nothing to check before.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from klear.data.problems import SYNTHETIC_REWARDS, ProblemSet, Task, load_problems
from klear.data.prompts import AS_GIVEN, PromptFormat
from klear.data.readers import DataError, file_signature, keep_read, read_numbered
from klear.data.row_parts import RowParts
from klear.data.sets import sources
from klear.data.sft import check_sft_rows


def check_data(config: DictConfig, keep: bool = False) -> None:
    """Read and check every data file of ``config``'s stage, each set of ``data.train`` and ``data.eval`` (RL: as
    problems; SFT: ``data.train``'s layout and conversations, ``data.eval`` as problems); raises `DataError` naming
    the file. ``keep``: what was read and checked is kept for the stage of this process (the module docstring)."""
    from klear.rewards.routing import routed_reward

    data = config.data
    if config.stage == "rl":
        task = Task(config.reward.name, data.prompt_key, data.reference_key)
        reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
        for source in sources(data.train):
            check_problems(source, task, reward, "train", PromptFormat.of(data), keep)
    else:
        task, reward = Task(config.eval.reward), routed_reward(config.eval.reward)
        for source in sources(data.train):
            if source not in SYNTHETIC_REWARDS:
                rows, _ = keep_read(source) if keep else read_numbered(source)
                if not rows:  # the stage's message for it, said before the model is loaded
                    raise DataError(f"{source}: no rows")
                check_sft_rows(rows, source, data)  # the layout, and a row that reads in it
    for source in sources(data.eval):
        check_problems(source, task, reward, "eval", PromptFormat.of(data), keep)


def check_problems(
    source: str, task: Task, reward: Any, split: str, prompt_format: PromptFormat = AS_GIVEN, keep: bool = False
) -> None:
    """`load_problems` of a problem file without a tokenizer, its prompts in ``prompt_format``; with ``keep``, its
    checked problems kept for the stage's load (`kept_problems`)."""
    if source in SYNTHETIC_REWARDS:
        return
    rows = RowParts(source) if RowParts.fits(source) else None  # a part at a time: a large file is not held whole
    problems = load_problems(source, task, reward, split=split, rows=rows, prompt_format=prompt_format, keep_rows=False)
    way = _way(task, reward, prompt_format)
    if keep and way is not None:
        _CHECKED[(source, split)] = (file_signature(source), way, problems)


def kept_problems(source: str, split: str, task: Task, reward: Any, prompt_format: PromptFormat) -> ProblemSet | None:
    """The problems `check_problems` kept of ``source`` for ``split``, read the same way, while the file is unchanged
    (taken: served once); None when there are none."""
    kept, way = _CHECKED.pop((source, split), None), _way(task, reward, prompt_format)
    if kept is None or way is None or kept[0] != file_signature(source) or kept[1] != way:
        return None
    return kept[2]


def _way(task: Task, reward: Any, prompt_format: PromptFormat) -> tuple | None:
    """How a set is read: its task, its reward's spec and its prompt format; None (never served) for a reward with
    no spec."""
    spec = getattr(reward, "spec", None)
    return None if spec is None else (task, spec(), prompt_format)


_CHECKED: dict[tuple[str, str], tuple[Any, tuple, ProblemSet]] = {}
"""``(source, split)`` -> (the file's signature when checked, how it was read (`_way`), its checked problems)."""
