"""The problems a stage reads from one source: every row checked as a run checks it, each prompt measured against
the run's limit, before anything is trained.

One function serves the run (`klear.stages.base.stage_sets`, which logs what it read) and ``python -m
klear.data show`` (which shows it), so a row that ``show`` prints is a row the run trains on, and a row the run
skips ``show`` prints as skipped, for the same reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klear.data.first_rows import FirstRows
from klear.data.preflight import kept_problems
from klear.data.problems import ProblemSet, Task, load_problems
from klear.data.prompts import PromptFormat, PromptTokens, char_bound, chat_template_problem
from klear.data.readers import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from klear.schema import RLRunConfig, SFTRunConfig


def read_stage_problems(
    config: RLRunConfig | SFTRunConfig,
    split: str,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    reward: Any,
    seed: int,
    max_new_tokens: int,
    source: str,
    num: int | None = None,
    measured: bool = True,
    first: int = 0,
    rows: FirstRows | None = None,
) -> ProblemSet:
    """The checked problems of ``source`` for ``config.data.<split>`` (``train`` or ``eval``): `load_problems` in
    the run's prompt format; a built-in task's ``num`` problems (default ``data.num_<split>``) of ``seed``.

    Prompts longer than the run's limit (`prompt_limit`) are handled by ``data.truncation`` (RL; skipped in SFT's
    evaluation); ``measured=False`` reads them unmeasured. ``first``: the file's first usable problems alone, read
    no further (`load_problems`), from ``rows`` when its first rows are read already. A file ``klear.fit``'s
    preflight checked is not read or checked again (`klear.data.preflight.kept_problems`): its prompts are measured.

    Raises:
        DataError: no usable row, a template the model's tokenizer lacks, or no room for a prompt.
    """
    data = config.data
    prompt_format = PromptFormat.of(data)
    if prompt_format.chat and (problem := chat_template_problem(tokenizer, "data.apply_chat_template=false")):
        raise DataError(f"model.path = {config.model.path!r}: {problem}")
    limit, too_long = prompt_limit(config, split, max_new_tokens) if measured else (0, "")
    checked = None if first or rows is not None else kept_problems(source, split, task, reward, prompt_format)
    return load_problems(
        source,
        task,
        reward,
        split=split,
        num=getattr(data, f"num_{split}") if num is None else num,
        seed=seed,
        levels=data.levels,
        prompt_length=PromptTokens(tokenizer) if measured else None,
        char_bound=char_bound(tokenizer) if measured else None,
        max_prompt_tokens=limit,
        truncation=data.truncation if config.stage == "rl" else "skip",  # SFT's data.truncation cuts its examples
        too_long=too_long,
        prompt_format=prompt_format,
        first=first,
        rows=rows,
        keep_rows=False,  # a run reads a problem's prompt and reference alone
        checked=checked,
    )


def prompt_limit(config: RLRunConfig | SFTRunConfig, split: str, max_new_tokens: int) -> tuple[int, str]:
    """The most tokens a prompt of ``config.data.<split>`` may have, and what the user can change when no prompt
    fits: ``data.max_prompt_tokens`` when set, else what the model's context leaves after ``max_new_tokens``, so no
    kept prompt can overflow generation. `DataError` when that leaves no room."""
    from klear.models import prompt_budget

    limit = getattr(config.data, "max_prompt_tokens", 0)
    too_long = "set a larger data.max_prompt_tokens within the model's context"
    if not limit:
        new_tokens = "rollout.max_new_tokens" if split == "train" else "eval.max_new_tokens"
        too_long = f"set a smaller {new_tokens} (the limit is the model's context less it)"
        try:
            limit = prompt_budget(config.model, max_new_tokens)
        except ValueError as error:
            raise DataError(f"{new_tokens} = {max_new_tokens}: {error}") from None
    if config.stage == "rl":
        too_long = f"data.truncation=left keeps each prompt's last tokens (the reference recipe's), or {too_long}"
    return limit, too_long
