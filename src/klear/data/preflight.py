"""The run's data checked before anything heavy is imported: what ``klear.fit`` can say about its data files in a
second, it says in a second.

Everything about a data file that needs no tokenizer is checked here: that it exists and parses, its layout
(detected from its first row, or the fields ``data.prompt_key`` / ``data.reference_key`` name), every row's
reference and route (`klear.data.problems.load_problems`, the loader the stage calls later). A source with no usable
row stops the run with one line (`DataError`); bad rows are left for the stage to warn about and count, once. What
needs the tokenizer (prompt lengths) comes after the model is loaded.

The rows are read once: `klear.data.readers.keep_read` keeps what this pass read for the stage's own read of the
same unchanged file. The built-in synthetic tasks are generated, not read: nothing to check before.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from klear.data.problems import SYNTHETIC_REWARDS, Task, load_problems
from klear.data.prompts import AS_GIVEN, PromptFormat
from klear.data.readers import DataError, keep_read
from klear.data.sets import sources
from klear.data.sft import check_sft_rows


def check_data(config: DictConfig) -> None:
    """Read and check every data file of ``config``'s stage, each set of ``data.train`` and ``data.eval`` (RL: as
    problems; SFT: ``data.train``'s layout and conversations, ``data.eval`` as problems); raises `DataError` naming
    the file."""
    from klear.rewards.routing import routed_reward

    data = config.data
    if config.stage == "rl":
        task = Task(config.reward.name, data.prompt_key, data.reference_key)
        reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
        for source in sources(data.train):
            check_problems(source, task, reward, "train", PromptFormat.of(data))
    else:
        task, reward = Task(config.eval.reward), routed_reward(config.eval.reward)
        for source in sources(data.train):
            if source not in SYNTHETIC_REWARDS:
                rows, _ = keep_read(source)
                if not rows:  # the stage's message for it, said before the model is loaded
                    raise DataError(f"{source}: no rows")
                check_sft_rows(rows, source, data)  # the layout, and a row that reads in it
    for source in sources(data.eval):
        check_problems(source, task, reward, "eval", PromptFormat.of(data))


def check_problems(source: str, task: Task, reward: Any, split: str, prompt_format: PromptFormat = AS_GIVEN) -> None:
    """`load_problems` of a problem file without a tokenizer, its prompts in ``prompt_format``, its rows kept for
    the stage's read."""
    if source in SYNTHETIC_REWARDS:
        return
    load_problems(source, task, reward, split=split, rows=keep_read(source), prompt_format=prompt_format)
