"""The options ``python -m klear.eval`` and ``python -m klear.data curate`` share, read once from the command line.

Both commands put a model's answers to a problem file through the RL stage's engine and score them with a
reward: the model, the engine, how it samples, the prompt limit and the reward workers are the same options
with the same ranges, so they are one frozen `SamplingOptions`, checked by one table (`check`). Each command
checks its own options (``--k``, ``--n``, ``--chunk``, ...) with `check_requirements` too. Both declare them with
`add_sampling_arguments`, each with its own defaults where they differ (``klear.eval`` samples as an evaluation
does, curate as RL does). Importing this module imports neither torch nor transformers: the checks run before
either is loaded.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import OmegaConf

from klear.config.load import ConfigError, load_config
from klear.data.prompts import PromptFormat
from klear.errors import did_you_mean
from klear.eval.tasks import EvalError
from klear.rollout.engine import NEW_TOKENS, SamplingParams
from klear.schema import VLLMConfig

MOST_SAMPLES = 65536
"""The most samples per problem (``klear.eval --n``, curate ``--k``): more than any published estimate draws."""
MOST_PROCESSES = 4096
"""The most threads or reward worker processes a command starts: more than any machine's cores."""
Requirement = tuple[str, Any, bool, str]
"""``(option, its value, whether it holds, what it must be)``."""
FLAGS = {NEW_TOKENS: "--max-new-tokens", "rollout.vllm.": "--vllm ", "rollout.max_new_tokens": "--max-new-tokens"}
"""The config keys the engines name in their errors, as these commands take them (`EngineError.renamed`)."""
VLLM_DEFAULTS = ("gpu_memory_utilization=0.9",)
"""Where these commands' ``vllm`` engine differs from a run's: the GPU is the engine's alone (vLLM's own default),
where a run leaves half of it to the trainer; ``--vllm`` overrides it."""


@dataclass(frozen=True)
class SamplingOptions:
    """How a command samples and scores (its ``--model`` ... ``--reward-timeout`` options).

    Args:
        model: ``--model``, a model directory or hub name (None: saved completions, no model).
        engine: ``--engine``, a name of `klear.rollout.engine.ENGINES` or an import path.
        temperature, top_p, top_k, max_new_tokens, seed: how the engine samples (``--temperature`` ...).
        max_prompt_tokens: longer prompts are skipped (0: the model's context minus ``max_new_tokens``).
        batch_size: sequences the engine samples together.
        threads: torch CPU threads (0: chosen by klear).
        num_workers, reward_timeout: reward worker processes (0: score in this process) and their deadline.
        overlap_scoring: ``--overlap-scoring`` / ``--no-overlap-scoring``: score each problem as it ends while the
            engine samples on (an RL run's ``reward.overlap``; None: when the engine computes on a GPU).
        vllm: ``--vllm KEY=VALUE`` as given: options of the ``vllm`` engine, by the keys of an RL run's
            ``rollout.vllm`` (`vllm_config`).
        rope_scaling: the model's rope scaling (``klear.eval --rope-scaling``; None: the checkpoint's).
        base: the base model of the adapter folder ``model`` (``klear.eval --base``; None: the one its
            ``adapter_config.json`` names, or ``model`` is a whole model).
        prompt_template, system_prompt, apply_chat_template: how each problem is put to the model
            (``--prompt-template``, ``--system-prompt``, ``--no-chat-template``; `prompt_format`).
    """

    model: str | None
    engine: str
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    max_prompt_tokens: int
    seed: int
    batch_size: int
    threads: int
    num_workers: int
    reward_timeout: float
    prompt_template: str = ""
    system_prompt: str = ""
    apply_chat_template: bool = True
    vllm: tuple[str, ...] = ()
    rope_scaling: dict[str, Any] | None = None
    base: str | None = None
    overlap_scoring: bool | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SamplingOptions:
        """The options of a parsed command line; a command without ``--rope-scaling`` or ``--base`` has None."""
        own = ("rope_scaling", "base")  # klear.eval's alone
        values = {field.name: getattr(args, field.name) for field in fields(cls) if field.name not in own}
        values["vllm"] = tuple(values["vllm"] or ())
        return cls(**values, **{name: vars(args).get(name) for name in own})

    def sampling(self, n: int) -> SamplingParams:
        """How the engine samples ``n`` answers per problem with these options: the one definition of
        ``klear.eval`` and ``curate``, so that with the same options a problem draws the same samples in both."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            n=n,
            seed=self.seed,
        )

    @property
    def prompt_format(self) -> PromptFormat:
        """What is put around each problem's prompt, as an RL run's ``data.prompt_template`` ... do."""
        return PromptFormat(self.prompt_template, self.system_prompt, self.apply_chat_template)

    def check_prompt_format(self) -> None:
        """`EvalError` naming ``--prompt-template`` or ``--system-prompt`` when the format cannot be used."""
        if (problem := self.prompt_format.problem()) is not None:
            field, reason = problem
            flag, value = {
                "template": ("--prompt-template", self.prompt_template),
                "system": ("--system-prompt", self.system_prompt),
            }[field]
            fix = "; write it into --prompt-template instead" if field == "system" else ""
            raise EvalError(f"{flag} {value!r}: {reason}{fix}")

    def vllm_config(self) -> VLLMConfig:
        """The ``vllm`` engine's options: its defaults (`VLLM_DEFAULTS` first) with the values of ``--vllm``, checked
        as the config loader checks ``rollout.vllm`` (read through the SFT schema's ``eval.vllm``, the same section,
        whose checks import no torch).

        Raises:
            EvalError: ``--vllm`` without ``--engine vllm``, a token that is no ``KEY=VALUE``, an unknown key or a
                value the key does not accept, named as ``--vllm KEY``.
        """
        if self.vllm and self.engine != "vllm":
            raise EvalError(f"--vllm {self.vllm[0]}: --vllm sets options of the vllm engine; give --engine vllm")
        keys = [field.name for field in fields(VLLMConfig)]
        for token in self.vllm:
            key, equals, _ = token.partition("=")
            if not (key and equals):
                raise EvalError(f"--vllm {token!r}: give KEY=VALUE, e.g. --vllm gpu_memory_utilization=0.9")
            if key not in keys:
                close = did_you_mean(key, keys)
                raise EvalError(
                    f"--vllm {token}: {key!r} is no option of the vllm engine; accepted: {', '.join(keys)}{close}"
                )
        try:
            config = load_config(None, [f"eval.vllm.{token}" for token in (*VLLM_DEFAULTS, *self.vllm)])
        except ConfigError as error:
            raise EvalError(str(error).replace("eval.vllm.", "--vllm ")) from None
        return VLLMConfig(**OmegaConf.to_container(config.eval.vllm))

    def requirements(self) -> list[Requirement]:
        return [
            ("--temperature", self.temperature, 0 <= self.temperature < math.inf, ">= 0 and finite"),
            ("--top-p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
            ("--top-k", self.top_k, self.top_k >= 0, ">= 0 (0: off)"),
            ("--max-new-tokens", self.max_new_tokens, self.max_new_tokens >= 1, ">= 1"),
            (
                "--max-prompt-tokens",
                self.max_prompt_tokens,
                self.max_prompt_tokens >= 0,
                ">= 0 (0: what the model's context leaves)",
            ),
            ("--batch-size", self.batch_size, self.batch_size >= 1, ">= 1"),
            (
                "--threads",
                self.threads,
                0 <= self.threads <= MOST_PROCESSES,
                f"in [0, {MOST_PROCESSES}] (0: chosen by klear)",
            ),
            ("--num-workers", self.num_workers, 0 <= self.num_workers <= MOST_PROCESSES, f"in [0, {MOST_PROCESSES}]"),
            (
                "--num-workers",
                self.num_workers,
                self.num_workers or not self.overlap_scoring,
                ">= 1 with --overlap-scoring (scoring in this process waits for the engine)",
            ),
            ("--reward-timeout", self.reward_timeout, 0 < self.reward_timeout < math.inf, "> 0 and finite"),
        ]


def add_sampling_arguments(
    parser: argparse.ArgumentParser,
    *,
    model_help: str,
    model_required: bool = False,
    temperature: float,
    temperature_help: str,
    top_p: float,
) -> None:
    """The options of `SamplingOptions` (``--model`` ... ``--reward-timeout``), in one group of ``parser``'s help.

    Args:
        model_help: what ``--model`` accepts, as the command says it.
        model_required: whether the command needs a model (``klear.eval`` can score saved completions instead).
        temperature, temperature_help: the default ``--temperature`` and why it is that.
        top_p: the default ``--top-p``.
    """
    group = parser.add_argument_group("sampling and scoring", "the model, how it samples, and the reward workers")
    group.add_argument("--model", required=model_required, help=model_help)
    group.add_argument("--engine", default="hf", help="rollout engine name or import path (default: %(default)s)")
    group.add_argument(
        "--temperature", type=float, default=temperature, help=f"{temperature_help} (default: %(default)s)"
    )
    group.add_argument("--top-p", type=float, default=top_p, help="nucleus sampling (default: %(default)s)")
    group.add_argument("--top-k", type=int, default=0, help="0: off (default: %(default)s)")
    group.add_argument(
        "--max-new-tokens", type=int, default=32768, help="response budget; tiny models need ~96 (default: %(default)s)"
    )
    group.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=0,
        help="skip longer prompts; 0: the model's context minus --max-new-tokens (default: %(default)s)",
    )
    group.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    group.add_argument("--batch-size", type=int, default=256, help="sequences sampled together (default: %(default)s)")
    group.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads; 0: chosen by klear from the free cores (default: 0)"
    )
    group.add_argument(
        "--vllm",
        action="append",
        metavar="KEY=VALUE",
        help="an option of --engine vllm by its key in rollout.vllm, e.g. --vllm tensor_parallel_size=2; repeatable "
        "(default: rollout.vllm's defaults, but gpu_memory_utilization=0.9: the GPU is the engine's alone)",
    )
    group.add_argument("--num-workers", type=int, default=0, help="reward worker processes; 0: in this process")
    group.add_argument(
        "--reward-timeout",
        type=float,
        default=60.0,
        help="per-sample deadline of the workers (s); a built-in reward's samples get at least its own bound",
    )
    group.add_argument(
        "--overlap-scoring",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --num-workers and --engine vllm: score each problem as its samples end, while the engine samples "
        "the rest (the same scores); default: on when vLLM computes on a GPU, off on a CPU, where they share the "
        "cores",
    )
    prompts = parser.add_argument_group(
        "prompt format", "what is put around each problem's prompt, as in training (docs/data.md#prompt-format)"
    )
    prompts.add_argument(
        "--prompt-template",
        default="",
        help="text with {prompt} where each problem's prompt goes, e.g. \"{prompt} Let's think step by step.\" "
        "(default: the prompt as it is)",
    )
    prompts.add_argument("--system-prompt", default="", help="a system turn for prompts that have none")
    prompts.add_argument(
        "--no-chat-template",
        dest="apply_chat_template",
        action="store_false",
        help="give the model the filled --prompt-template as it is, without the chat template (base models)",
    )


def check_requirements(requirements: Sequence[Requirement]) -> None:
    """`EvalError` for the first requirement that does not hold: ``--flag must be ..., got value``."""
    for flag, value, ok, requirement in requirements:
        if not ok:
            raise EvalError(f"{flag} must be {requirement}, got {value}")


def check_greedy(options: SamplingOptions, samples: int, fix: str) -> None:
    """Greedy decoding gives one answer per problem: `EvalError` when ``samples`` > 1 are asked for, with ``fix``."""
    if options.temperature == 0 and samples > 1:
        raise EvalError(f"greedy decoding (--temperature 0) gives one answer per problem: {fix}")
