"""The problems of an evaluation, shared by ``python -m klear.eval`` and ``python -m klear.data curate``.

`load_eval_problems` reads a problem file once, recognises its layout from its first row and picks the task (code
for code layouts and test lists, else math; rows with a data source are each scored by their source's verifier
unless ``--reward`` names one, which then scores every row; ``--prompt-key`` and ``--reference-key`` override the
fields, see `klear.data.problems.choose_task`), builds the reward, and loads the problems with the loader RL
training uses (`klear.data.problems.load_problems`): a row without the fields, with a reference the reward
rejects, of a source no route knows, or with a prompt longer than the limit is skipped with a warning naming its
file and line. Without a model (``--completions``), prompts are not measured. What cannot be
evaluated at all — an unknown reward or option, a model path that is not a model, a response budget that leaves no
room for a prompt — raises `EvalError`, one line naming the argument.

Importing this module imports neither torch nor transformers: the command checks its arguments and reads its data
before it loads them, for the model's tokenizer and context only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from klear.config.model_path import is_adapter_folder, model_path_problem
from klear.data.first_rows import FirstRows
from klear.data.problems import ProblemSet, Task, choose_task, load_problems
from klear.data.prompts import AS_GIVEN, PromptFormat, PromptTokens
from klear.data.readers import read_numbered, warn_bad_rows
from klear.errors import UserError, first_line
from klear.rewards import Reward, get_reward
from klear.rewards.routing import routed_reward
from klear.schema import ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class EvalError(UserError):
    """An evaluation that cannot start as asked: one line naming the argument or row and what is accepted."""


Select = Callable[[list[tuple[int, dict]]], tuple[list[tuple[int, dict]], list[int]]]
"""``(line, row)`` of a whole file -> those to evaluate, and the lines of the others (`load_eval_problems`)."""


def load_eval_problems(
    data: str,
    *,
    reward: str | None,
    prompt_key: str | None,
    reference_key: str | None,
    model: str | None,
    max_new_tokens: int,
    max_prompt_tokens: int = 0,
    rope_scaling: dict[str, Any] | None = None,
    reward_options: dict[str, Any] | None = None,
    base: str | None = None,
    prompt_format: PromptFormat = AS_GIVEN,
    first: int = 0,
    head: FirstRows | None = None,
    select: Select | None = None,
) -> tuple[ProblemSet, Task, Reward]:
    """The checked problems of ``data`` (``--data``; bad rows skipped by file and line), their task and reward.

    Args:
        reward, prompt_key, reference_key: ``--reward``, ``--prompt-key``, ``--reference-key`` (None: from the
            fields of the first row), with ``reward_options`` the reward's options.
        model: ``--model``, whose tokenizer measures the prompts (None: no prompt-length check).
        base: ``--base``, the base model of the adapter folder ``model``, whose tokenizer and context count then.
        max_new_tokens, max_prompt_tokens, rope_scaling: prompts longer than ``max_prompt_tokens`` are skipped (0:
            the model's context, stretched by ``rope_scaling``, minus ``max_new_tokens``).
        prompt_format: what is put around each prompt (``--prompt-template`` ...; `klear.data.prompts.PromptFormat`).
        first: ``--limit``: the first problems alone, the rows past them neither checked nor measured (0: all).
        head: with ``first``, the file's first rows as the command's check read them (read here when None), read on
            as far as the first problems need.
        select: the rows to evaluate, of the whole file (not with ``first``): ``klear.eval --where``
            (`klear.eval.where.keep_rows`); the lines of the others are kept as the set's ``left_out``.

    Raises:
        EvalError: an unknown reward or option, or a model that cannot be loaded or leaves no room for a prompt.
        klear.data.readers.DataError: an unreadable file, or one without a usable row.
    """
    left_out: list[int] = []
    if first:  # read as far as the first problems need
        rows = head or FirstRows(data, 4 * first)
        task = choose_task([row for _, row in rows.rows], data, reward, prompt_key, reference_key)
    else:
        numbered, bad = read_numbered(data)
        if select is not None:
            numbered, left_out = select(numbered)
        rows = (numbered, bad)
        task = choose_task([row for _, row in numbered], data, reward, prompt_key, reference_key)
    built = build_reward(task.reward, reward_options or {}, route=task.route)
    prompt_length, limit = None, 0
    if model is not None:
        check_model_path(model, base)
        source, option = (base, "--base") if base else (model, "--model")
        limit = max_prompt_tokens or _prompt_budget(source, max_new_tokens, rope_scaling, option)
        tokenizer = load_eval_tokenizer(source, option, chat=prompt_format.chat)
        prompt_length = PromptTokens(tokenizer)

    remedy = "pass a smaller --max-new-tokens (the limit is the model's context less it)"
    if max_prompt_tokens:
        remedy = "pass a larger --max-prompt-tokens within the model's context"
    problems = load_problems(
        data,
        task,
        built,
        rows=rows,
        prompt_length=prompt_length,
        max_prompt_tokens=limit,
        too_long=remedy,
        prompt_format=prompt_format,
        first=first,
    )
    problems.left_out = left_out
    problems.log("--data")
    warn_bad_rows(problems.bad, {data: problems.rows})
    return problems, task, built


def build_reward(name: str, options: dict[str, Any], route: bool = False) -> Reward:
    """The reward ``name`` with ``options`` (routing rows with a data source to their publishers' verifiers when
    ``route``); `EvalError` naming the reward or option when it cannot be built."""
    try:
        return routed_reward(name, options) if route else get_reward(name, **options)
    except (ValueError, TypeError) as error:  # the message names the reward (or option) and the accepted ones
        hint = ""
        if isinstance(error, TypeError) and options:  # an option's value of a type the reward cannot compare
            given = ", ".join(f"{key}={value!r}" for key, value in options.items())
            hint = f" (--reward-option {given}): give each option a value of the type the reward takes"
        raise EvalError(f"--reward {name}: {first_line(error)}{hint}") from error


def load_eval_tokenizer(path: str, option: str = "--model", chat: bool = True) -> PreTrainedTokenizerBase:
    """The tokenizer of the model at ``path`` (``option``: ``--model``, or ``--base`` for an adapter's base model);
    `EvalError` when there is none, or when it has no chat template to render the prompts with (``chat``: the
    prompts go through one, no ``--no-chat-template``)."""
    from klear.data.prompts import chat_template_problem
    from klear.models import load_tokenizer

    try:
        _check_path(path, option)
        tokenizer = load_tokenizer(ModelConfig(path=path))
    except (OSError, ValueError) as error:  # unknown hub name, missing tiny-sft checkpoint
        raise EvalError(f"{option} {path}: {first_line(error)}") from error
    if chat and (problem := chat_template_problem(tokenizer, "--no-chat-template")) is not None:
        raise EvalError(f"{option} {path}: {problem}")
    return tokenizer


def check_model_path(path: str, base: str | None = None) -> None:
    """``--model`` must be a model directory where it can only be a local path, with a config.json that says which
    model it is (`model_path_problem`), or a PEFT adapter folder (a LoRA run's ``adapter/``) over a base model: the
    one its ``adapter_config.json`` names, or ``base`` (``--base``), which needs an adapter folder. Checked before
    transformers is imported, and named as ``--model`` or ``--base``."""
    if base is None:
        problem = model_path_problem(path)
        if problem and is_adapter_folder(path):
            raise EvalError(f"--model {path}: {problem}; give the base model with --base PATH")
        if problem:
            raise EvalError(f"--model {path}: {problem}")
        return
    if not is_adapter_folder(path):
        raise EvalError(
            f"--base {base} goes with an adapter folder, and --model {path} is none (no adapter_config.json there); "
            "give the adapter/ folder of a LoRA run, or drop --base"
        )
    _check_path(base, "--base")


def _check_path(path: str, option: str) -> None:
    problem = model_path_problem(path)
    if problem:
        raise EvalError(f"{option} {path}: {problem}")


def _prompt_budget(
    path: str, max_new_tokens: int, rope_scaling: dict[str, Any] | None = None, option: str = "--model"
) -> int:
    from klear.models import model_context, prompt_budget

    _check_path(path, option)
    config = ModelConfig(path=path, rope_scaling=rope_scaling or {})
    try:  # first the model's context alone: transformers raises ValueError for a config it cannot read, too
        model_context(config)
    except (OSError, ValueError) as error:  # an unknown model_type, a hub name that cannot be fetched
        raise EvalError(f"{option} {path}: {first_line(error)}") from error
    except AttributeError as error:  # a config without max_position_embeddings
        raise EvalError(
            f"{option} {path}: its config gives no context length ({first_line(error)}); give --max-prompt-tokens N"
        ) from error
    try:
        return prompt_budget(config, max_new_tokens)
    except ValueError as error:  # the response budget leaves no room for a prompt
        raise EvalError(
            f"--max-new-tokens {max_new_tokens}: {error}; pass a smaller --max-new-tokens (the built-in tiny models "
            "need ~96-160)"
        ) from error
