"""Import paths of klear 0.1 that moved in the package layout of 0.2: still importable, with a DeprecationWarning.

They are removed in the next release. Each old module is a thin stand-in whose attributes are looked up in the
module(s) that now hold them, so ``from klear.modules.rl import RLModule`` and ``import klear.config_load`` keep
working; names that the old ``klear.data``, ``klear.eval`` and ``klear.compare`` modules exported are served by
`moved_attribute` from the package ``__getattr__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "klear.advantages": ("klear.stages.advantages",),
    "klear.attention": ("klear.models.attention",),
    "klear.compare_report": ("klear.compare.report",),
    "klear.config_load": ("klear.config.load",),
    "klear.data.code_tests": ("klear.prep.code_tests",),
    "klear.data.curate": ("klear.prep.curate",),
    "klear.data.decontaminate": ("klear.prep.decontaminate",),
    "klear.data.dedup": ("klear.prep.dedup",),
    "klear.data.mix_command": ("klear.prep.mix",),
    "klear.data.mixing": ("klear.prep.mixing",),
    "klear.data.ngrams": ("klear.prep.ngrams",),
    "klear.data.pass_rates": ("klear.prep.pass_rates",),
    "klear.data.rowfiles": ("klear.prep.rowfiles",),
    "klear.data.tiny_model": ("klear.models.tiny",),
    "klear.data.tokenizer": ("klear.models.tokenizer",),
    "klear.distributed": ("klear.runtime.distributed",),
    "klear.eval_metrics": ("klear.eval.metrics",),
    "klear.evaluation": ("klear.eval.in_training",),
    "klear.modules": (),
    "klear.modules.logprobs": ("klear.stages.logprobs",),
    "klear.modules.rl": ("klear.stages.rl",),
    "klear.modules.rl_batch": ("klear.stages.rollout_batch",),
    "klear.modules.rl_loss": ("klear.stages.update",),
    "klear.modules.scoring": ("klear.rewards.scorer",),
    "klear.modules.sft": ("klear.stages.sft",),
    "klear.modules.stage": ("klear.stages.base",),
    "klear.optim": ("klear.runtime.optim",),
    "klear.rollout.callback": ("klear.rollout.refresh",),
    "klear.run_callbacks": ("klear.runtime.checkpoints", "klear.runtime.metrics_log"),
    "klear.run_dir": ("klear.runtime.run_dir",),
    "klear.stats": ("klear.compare.stats",),
    "klear.strategies": ("klear.runtime.strategies",),
}
"""Old module -> the module(s) its names live in now (``klear.modules`` was a namespace of the stages)."""

_EVAL_CLI = "EvalError parse_args main check_args load_eval_problems build_reward build_engine check_model_path run"
MOVED_NAMES: dict[str, dict[str, str]] = {
    "klear.eval": dict.fromkeys(_EVAL_CLI.split(), "klear.eval.cli"),
    "klear.compare": {
        "Run": "klear.compare.runs",
        **dict.fromkeys(["parse_args", "plan", "execute", "main"], "klear.compare.cli"),
    },
    "klear.data": {
        **dict.fromkeys(["BadRow", "DataError", "read_numbered", "read_rows", "write_jsonl"], "klear.data.readers"),
        **dict.fromkeys(
            ["ChatTemplateError", "IGNORE_INDEX", "SFTStats", "build_sft_examples", "to_messages"], "klear.data.sft"
        ),
        **dict.fromkeys(["IM_END", "IM_START", "PAD_TOKEN", "THINK_END", "THINK_START"], "klear.models.tokenizer"),
        "build_tokenizer": "klear.models.tokenizer",
        "load_tokenizer": "transformers:AutoTokenizer.from_pretrained",  # what the 0.1 function did
        **dict.fromkeys(["TINY_SIZES", "build_tiny", "load_tiny", "tiny_config"], "klear.models.tiny"),
        **dict.fromkeys(["MixReport", "MixSpec", "Source", "build_mix", "load_spec"], "klear.prep.mixing"),
        **dict.fromkeys(["Problem", "ProblemSet", "Task", "choose_task", "load_problems"], "klear.data.problems"),
        **dict.fromkeys(
            ["SCHEMES", "collate", "make_batches", "pack", "padding_fraction", "plan_batches"], "klear.data.packing"
        ),
        **dict.fromkeys(
            [
                "DEFAULT_LEVELS",
                "LEVELS",
                "Level",
                "generate_problems",
                "make_problem",
                "plain_solution",
                "sft_rows",
                "split_of",
                "to_chat",
            ],
            "klear.data.synthetic",
        ),
        "encode_prompt": "klear.data.prompts",
        "generate_code_problems": "klear.data.synthetic_code",
    },
}
"""Package -> names the old module of that name exported -> the module that holds each now (or
``module:attribute`` where the name changed)."""


def moved_attribute(package: str, name: str) -> Any:
    """``package.name`` from its new module, with a DeprecationWarning; AttributeError for any other name."""
    where = MOVED_NAMES.get(package, {}).get(name)
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    _warn(f"{package}.{name}", f"{module}.{attribute or name}")
    value = importlib.import_module(module)
    for part in (attribute or name).split("."):
        value = getattr(value, part)
    return value


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path is removed in the next release", DeprecationWarning, stacklevel=4
    )


class _MovedModule(types.ModuleType):
    """Stand-in for an old module: each attribute is read from the first new module that has it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for target in MOVED_MODULES[self.__name__]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(
            f"module {self.__name__!r} (moved to {', '.join(MOVED_MODULES[self.__name__])}) has no attribute {name!r}"
        )


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _MovedModule(spec.name)
        if not MOVED_MODULES[spec.name]:
            module.__path__ = []  # a package, so that its old submodules are found here too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        new = " and ".join(MOVED_MODULES[module.__name__]) or "klear.stages"
        message = f"{module.__name__} moved to {new}; the old path is removed in the next release"
        warnings.warn(message, DeprecationWarning, stacklevel=2)


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(), is_package=not MOVED_MODULES[fullname])


def install() -> None:
    """Put the finder of the old module paths first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
