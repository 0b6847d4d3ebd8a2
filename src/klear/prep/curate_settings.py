"""What a ``python -m klear.data curate`` run does, read once from its command line: `CurateSettings`.

The command line is read here and nowhere else: the preset fills in ``--k``, ``--reward`` and ``--band``, the
reward options are parsed, and the model, engine and sampling options are the `SamplingOptions` that
``klear.eval`` reads too, checked by the same table. Nothing later reads or changes the parsed arguments.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from klear.data.problems import Task
from klear.data.prompts import AS_GIVEN
from klear.data.readers import data_stem
from klear.eval.options import MOST_SAMPLES, SamplingOptions, check_greedy, check_requirements
from klear.prep.pass_rates import PRESETS, Band
from klear.prep.rowfiles import CommandError

DEFAULT_K = 16
SAMPLING_KEYS = (
    *("model", "engine", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed"),
    *("reward", "reward_options", "prompt_key", "reference_key"),
)
"""What a problem's samples and scores depend on: a rerun into the same folder must keep these (and the prompt
format, where one is given)."""


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, else ``outputs/curate/<data stem>``."""
    return Path(args.out or Path("outputs") / "curate" / data_stem(args.data))


@dataclass(frozen=True)
class CurateSettings:
    """What a curate run does, read once from its command line (`from_args`; the preset filled in).

    Args:
        data, out: ``--data`` and the output folder (`out_dir`).
        band: the pass rates kept; ``preset`` the rule it came from (None: ``--band``).
        k: samples per problem; ``reward``, ``reward_options``, ``prompt_key``, ``reference_key`` the task asked
            for (None: from the fields of the first row, or the preset's reward).
        chunk, max_problems, overwrite: problems per engine call, at most this many sampled now, earlier results
            discarded.
        sampling: the model, engine and sampling and reward-worker options shared with ``klear.eval``.
    """

    data: str
    out: Path
    band: Band
    preset: str | None
    k: int
    reward: str | None
    reward_options: dict[str, Any]
    prompt_key: str | None
    reference_key: str | None
    chunk: int
    max_problems: int | None
    overwrite: bool
    sampling: SamplingOptions

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CurateSettings:
        preset = PRESETS.get(args.preset, {})
        band = args.band or preset.get("band")
        if not band:  # ``--band ''``: argparse's group took it as given
            raise CommandError(
                f"--band {args.band!r}: give the pass rates to keep, e.g. --band '[0.5, 1]', or a --preset "
                f"({', '.join(sorted(PRESETS))})"
            )
        return cls(
            data=args.data,
            out=out_dir(args),
            band=Band.parse(band),
            preset=args.preset,
            k=preset.get("k", DEFAULT_K) if args.k is None else args.k,
            reward=args.reward or preset.get("reward"),
            reward_options=parse_options(args.reward_option),
            prompt_key=args.prompt_key,
            reference_key=args.reference_key,
            chunk=args.chunk,
            max_problems=args.max_problems,
            overwrite=args.overwrite,
            sampling=SamplingOptions.from_args(args),
        )

    def check(self) -> None:
        """The ranges of the options (the table shared with ``klear.eval``, then curate's own)."""
        check_requirements(
            [
                ("--k", self.k, 1 <= self.k <= MOST_SAMPLES, f"in [1, {MOST_SAMPLES}]"),
                ("--chunk", self.chunk, self.chunk >= 1, ">= 1"),
                ("--max-problems", self.max_problems, self.max_problems is None or self.max_problems >= 1, ">= 1"),
                *self.sampling.requirements(),
            ]
        )
        self.sampling.check_prompt_format()
        self.sampling.vllm_config()
        check_greedy(self.sampling, self.k, "a pass rate needs k > 1")

    def recorded(self, task: Task) -> dict[str, Any]:
        """What a problem's samples and scores depend on (`SAMPLING_KEYS`), with the reward and fields ``task``
        resolved to: ``settings.json``, which a rerun into the same folder must match."""
        options = self.sampling
        values = {
            **{key: getattr(options, key) for key in ("model", "engine")},
            "k": self.k,
            **{key: getattr(options, key) for key in ("temperature", "top_p", "top_k", "max_new_tokens", "seed")},
            "reward": task.reward,
            "reward_options": self.reward_options,
            "prompt_key": task.prompt_key,
            "reference_key": task.reference_key,
        }
        recorded = {key: values[key] for key in SAMPLING_KEYS}
        if options.prompt_format != AS_GIVEN:  # recorded when set: earlier folders stay valid
            recorded["prompt_format"] = options.prompt_format.describe()
        return recorded


def parse_options(items: list[str]) -> dict[str, Any]:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--reward-option {item!r}: expected KEY=VALUE, e.g. fallbacks=[answer_is]")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except (yaml.YAMLError, RecursionError) as error:
            problem = getattr(error, "problem", None) or "nested too deeply"
            raise CommandError(
                f"--reward-option {item!r}: the value is not valid YAML ({problem}); write it as YAML, e.g. "
                "fallbacks=[answer_is]"
            ) from None
    return options
