"""Loading, merging and checking run configs, with one-line errors that name the key and what is accepted (and,
for a misspelt key, objective hyperparameter or reward option, the closest accepted name).

Order of precedence: the stage's dataclass defaults (:mod:`klear.schema`), then the YAML file, then ``key=value``
overrides, then ``--objective``. Everything is checked before any model is built, so a typo costs a second,
not a run.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import importlib.util
import inspect
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from klear.config.model_path import model_path_problem
from klear.config.precision import precision_problem
from klear.errors import UserError, did_you_mean, first_line
from klear.schema import SCHEMAS
from klear.schema.fields import finite, interpolation, shape_problem
from klear.schema.sections import ROPE_TYPES


class ConfigError(UserError):
    """A bad config: the message is one line naming the key (or file) and the accepted values."""


def parse_overrides(tokens: list[str]) -> DictConfig:
    """``["trainer.max_steps=10", "objective.eps_high=0.3"]`` -> a config of those keys.

    A value is read as YAML (``10``, ``1e-3``, ``[0.9, 0.95]``, ``null``), except where a key the schema types as
    text would be read as a mapping or a list, or not at all: it takes the text as written, so that
    ``data.prompt_template={prompt} Answer:`` and ``data.prompt_template=User: {prompt}`` need no quoting.
    """
    bad = [token for token in tokens if "=" not in token or token.startswith("=")]
    if bad:
        raise ConfigError(f"override {bad[0]!r} is not of the form key=value (for example trainer.max_steps=10)")
    layer = OmegaConf.create()
    for token in tokens:
        key, _, text = token.partition("=")
        as_text = _text_key(key)
        try:
            value = OmegaConf.from_dotlist([token])
            kept = not (as_text and isinstance(OmegaConf.select(value, key), (DictConfig, ListConfig)))
        except Exception as error:  # yaml.YAMLError and OmegaConf's own
            if not as_text:
                raise ConfigError(f"override {token!r} cannot be parsed: {_yaml_problem(error)}") from error
            kept = False
        if not kept:
            value = OmegaConf.create()
            OmegaConf.update(value, key, text)
        layer = OmegaConf.merge(layer, value)
    return layer


def _text_key(key: str) -> bool:
    """Whether a schema (of any stage) types the dotted ``key`` as text."""

    def text(schema: type, parts: list[str]) -> bool:
        head, *rest = parts
        if rest:
            sections = _sections(schema)
            return head in sections and text(sections[head], rest)
        return typing.get_type_hints(schema).get(head) is str

    return any(text(schema, key.split(".")) for schema in SCHEMAS.values())


def read_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--config {str(path)!r} is a directory; give a YAML file, e.g. configs/rl.yaml")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        loaded = OmegaConf.load(path)
    except Exception as error:  # yaml.YAMLError and friends
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(error)}") from error
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, not a {type(loaded).__name__}")
    return loaded


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, objective: str | None = None
) -> DictConfig:
    """The checked run config: schema defaults <- YAML file <- ``key=value`` overrides <- ``objective``."""
    layers = [read_yaml(path)] if path is not None else []
    layers.append(parse_overrides(list(overrides or [])))
    if objective is not None:
        layers.append(OmegaConf.create({"objective": {"name": objective}}))
    stage = "sft"
    for layer in layers:
        stage = layer.get("stage", stage)
    if stage not in SCHEMAS:
        raise ConfigError(f"stage {stage!r} is not one of: {', '.join(SCHEMAS)}")
    if objective is not None and "objective" not in {field.name for field in dataclasses.fields(SCHEMAS[stage])}:
        raise ConfigError(f"--objective applies to stages with an objective section, not stage {stage!r}")
    for layer in layers:  # before the merge, whose messages for these name neither the key nor the shape
        _check_shapes(OmegaConf.to_container(layer, resolve=False), SCHEMAS[stage], prefix="")
    try:
        config = OmegaConf.merge(OmegaConf.structured(SCHEMAS[stage]), *layers)
    except OmegaConfBaseException as error:
        raise ConfigError(_explain(error, stage)) from error
    except (TypeError, ValueError, ArithmeticError) as error:  # a shape _check_shapes does not know yet
        raise ConfigError(f"bad config: {_first_line(error)}") from error
    resolve_interpolations(config)
    check_config(config)
    return config


def resolve_interpolations(config: DictConfig) -> None:
    """Replace every ``${...}`` of ``config`` by its value, in place, so the checks, ``--print-config`` and the run
    see the values; an environment variable that is not set, a key that does not exist or a cycle of references
    is one line naming the key."""
    try:
        OmegaConf.resolve(config)
    except OmegaConfBaseException as error:
        # OmegaConf names no key when the resolved value does not fit the field (``data.levels: ${model}``)
        key = getattr(error, "full_key", None) or _unresolvable_key(config, prefix="") or "?"
        raw: Any = OmegaConf.to_container(config, resolve=False)
        for part in re.findall(r"[^.\[\]]+", key):
            raw = raw.get(part) if isinstance(raw, dict) else raw[int(part)] if isinstance(raw, list) else None
        reason = re.sub(r"^\w+ raised while resolving interpolation: ", "", _first_line(error)).strip('"')
        reason = re.sub(r"^Environment variable ('.*') not found$", r"environment variable \1 is not set", reason)
        if reason == "Recursive interpolation detected":
            reason = "its references lead back to it (a cycle)"
        raise ConfigError(f"{key} = {raw!r} cannot be resolved: {reason}") from None


def _unresolvable_key(node: DictConfig | ListConfig, prefix: str) -> str | None:
    """The dotted key of the first ``${...}`` under ``node`` that cannot be resolved into its field, or None."""
    for name in node.keys() if isinstance(node, DictConfig) else range(len(node)):
        key = f"{prefix}[{name}]" if isinstance(node, ListConfig) else f"{prefix}.{name}" if prefix else str(name)
        child = node._get_node(name)
        if OmegaConf.is_interpolation(node, name):
            with contextlib.suppress(OmegaConfBaseException):
                node[name]
                continue
            return key
        container = isinstance(child, DictConfig | ListConfig) and not child._is_none()
        if container and (found := _unresolvable_key(child, key)):
            return found
    return None


def check_config(config: DictConfig) -> None:
    """Closed sets of values (``choices``), numeric ranges (``range``) and combinations types cannot express."""
    _check_fields(config, SCHEMAS[config.stage], prefix="")
    if problem := precision_problem(config):
        raise ConfigError(problem)
    if config.eval.temperature == 0 and config.eval.samples != 1:
        raise ConfigError("eval.samples > 1 needs eval.temperature > 0 (greedy decoding gives one answer)")
    _check_keep_best(config)
    if config.optim.min_lr > config.optim.lr:
        raise ConfigError(f"optim.min_lr ({config.optim.min_lr}) must not exceed optim.lr ({config.optim.lr})")
    if not all(0 <= beta < 1 for beta in config.optim.betas):
        raise ConfigError(f"optim.betas = {list(config.optim.betas)} is not accepted; accepted: two numbers in [0, 1)")
    _check_sets(config.data)
    _check_best_metric(config)
    _check_levels(config.data)
    _check_prompt_format(config.data)
    _check_synthetic_rewards(config)
    check_rope_scaling(config.model.rope_scaling)
    _check_lora(config.model.lora)
    problem = model_path_problem(config.model.path)
    if problem:
        raise ConfigError(f"model.path = {config.model.path!r}: {problem}")
    for switch, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if config.logging[switch] and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logging.{switch}=true needs the {package} package: pip install {package}")
    for check in STAGE_CHECKS.get(config.stage, ()):
        check(config)


def _check_keep_best(config: DictConfig) -> None:
    """``trainer.keep_best`` compares the checkpoints by their evaluations, so every checkpoint must have one."""
    save, scored = config.trainer.checkpoint_every_n_steps, config.eval.every_n_steps
    if config.trainer.keep_best and not (save and scored and save % scored == 0):
        raise ConfigError(
            f"trainer.keep_best=true keeps the checkpoint that scored best, so each checkpoint needs an evaluation: "
            f"set trainer.checkpoint_every_n_steps (now {save}) to a multiple of eval.every_n_steps (now {scored}), "
            "both above 0"
        )


def _check_best_metric(config: DictConfig) -> None:
    """``trainer.best_metric`` is a metric every evaluation of the run logs (`klear.eval.in_training.evaluate`)."""
    from klear.data.sets import metric_suffix, named_sets

    suffixes = [metric_suffix(name) for name in named_sets(_sets_value(config.data, "eval"))]
    logged = ["eval/accuracy", *(f"eval/accuracy{suffix}" for suffix in suffixes if suffix)]
    samples = config.eval.samples if config.eval.temperature > 0 else 1
    if samples > 1:  # pass@K; and maj@K, where the evaluation's reward is math's, whose samples vote
        voting = (config.eval.reward if config.stage == "sft" else config.reward.name) == "math"
        kinds = ["pass", "maj"] if voting else ["pass"]
        logged += [f"eval/{kind}_at_{samples}{suffix}" for kind in kinds for suffix in dict.fromkeys(["", *suffixes])]
    if config.trainer.best_metric not in logged:
        raise ConfigError(
            f"trainer.best_metric = {config.trainer.best_metric!r} is not a metric this run's evaluation logs; "
            f"accepted: {', '.join(logged)}"
        )


def check_rl(config: DictConfig) -> None:
    """The RL stage's names resolve (objective and its hyperparameters, reward and its options, advantage
    estimator, engine) and its sizes fit together."""
    from klear.objectives import objective_class
    from klear.objectives.advantages import ADVANTAGES
    from klear.rewards.base import REWARDS
    from klear.rollout.engine import ENGINES

    objective = OmegaConf.to_container(config.objective)
    if "name" not in objective:
        raise ConfigError("objective.name is missing; set it or pass --objective NAME")
    name = objective.pop("name")
    options = OmegaConf.to_container(config.reward.options)

    def resolve(build: collections.abc.Callable[[], Any]) -> Any:
        try:
            return build()
        except (ValueError, TypeError, RuntimeError) as error:  # their messages name the component and the values
            raise ConfigError(_first_line(error)) from error

    # The built objective: its traits (token_level, advantage_linear, needs_entropy) may read its options.
    built = resolve(lambda: _check_call("objective", objective_class(name), objective, name))
    resolve(lambda: _check_call("reward.options", REWARDS.get(config.reward.name), options, config.reward.name))
    resolve(lambda: ADVANTAGES.get(config.algorithm.advantage))
    resolve(lambda: ENGINES.get(config.rollout.engine))
    _check_routes(config.reward)
    rollout, algorithm = config.rollout, config.algorithm
    if rollout.group_size < 2 and algorithm.advantage != "dr_grpo":
        raise ConfigError(f"rollout.group_size must be >= 2 for algorithm.advantage={algorithm.advantage}")
    if config.reward.overlap and not config.reward.num_workers:
        raise ConfigError(
            "reward.overlap=true needs reward.num_workers >= 1 (scoring in this process waits for the engine)"
        )
    if algorithm.tis_cap and rollout.old_logprobs != "trainer":
        raise ConfigError("algorithm.tis_cap needs rollout.old_logprobs=trainer (it weights trainer vs engine)")
    if algorithm.tis_cap and not built.traits.token_level:
        raise ConfigError(
            f"algorithm.tis_cap = {algorithm.tis_cap} weights each token's advantage, which objective {name!r} "
            "(one ratio per sequence) does not support; set algorithm.tis_cap=0"
        )
    if algorithm.tis_cap and not built.traits.advantage_linear:
        raise ConfigError(
            f"algorithm.tis_cap = {algorithm.tis_cap} weights each token's advantage, which objective {name!r} "
            "(not linear in the advantage) does not support; set algorithm.tis_cap=0"
        )
    if built.traits.needs_entropy and rollout.old_logprobs != "trainer":
        raise ConfigError(
            f"objective {name!r} reads the old policy's entropies, which only the trainer's pass computes: set "
            f"rollout.old_logprobs=trainer (it is {rollout.old_logprobs})"
        )
    if config.reward.overlong_buffer > rollout.max_new_tokens:
        raise ConfigError("reward.overlong_buffer must not exceed rollout.max_new_tokens")
    if rollout.worker_devices and not rollout.max_staleness:
        raise ConfigError("rollout.worker_devices places rollout workers, which need rollout.max_staleness >= 1")
    if rollout.worker_devices and config.trainer.accelerator == "cpu":
        raise ConfigError("rollout.worker_devices names GPUs: set trainer.accelerator=gpu (or leave it empty)")
    if algorithm.mini_batch_prompts > rollout.prompts_per_step:
        raise ConfigError(
            f"algorithm.mini_batch_prompts = {algorithm.mini_batch_prompts} exceeds rollout.prompts_per_step = "
            f"{rollout.prompts_per_step}: a mini-batch is a share of the step's prompts; set "
            f"algorithm.mini_batch_prompts <= {rollout.prompts_per_step}"
        )
    if any(device < 0 for device in rollout.worker_devices):
        raise ConfigError(f"rollout.worker_devices = {list(rollout.worker_devices)}: GPU indices are >= 0")


def _check_routes(reward: DictConfig) -> None:
    """Every ``reward.by_source`` route names a reward (a name or ``{name, options}``) whose options it accepts."""
    from klear.rewards.base import REWARDS
    from klear.rewards.routing import spec_of

    for source, spec in OmegaConf.to_container(reward.by_source).items():
        key = f"reward.by_source.{source}"
        try:
            name, options = spec_of(spec)
        except ValueError as error:
            raise ConfigError(f"{key}: {_first_line(error)}") from error
        if name == reward.name:
            options = {**OmegaConf.to_container(reward.options), **options}
        try:
            _check_call(f"{key}.options", REWARDS.get(name), options, name)
        except (ValueError, TypeError, RuntimeError) as error:
            raise ConfigError(f"{key}: {_first_line(error)}") from error


def check_rope_scaling(rope_scaling: Any, key: str = "model.rope_scaling") -> None:
    """``rope_scaling`` (``model.rope_scaling``, or ``klear.eval --rope-scaling`` named by ``key``): empty, or a
    ``rope_type`` transformers knows with a finite ``factor`` > 0 (the context becomes ``factor`` x the original)
    and, if given, an ``original_max_position_embeddings`` >= 1. `ConfigError` naming the key otherwise."""
    if not rope_scaling:
        return
    shown = OmegaConf.to_container(rope_scaling) if isinstance(rope_scaling, DictConfig) else rope_scaling

    def part(name: str) -> str:
        return f"{key} {name}" if key.startswith("--") else f"{key}.{name}"

    name = "rope_type" if "rope_type" in rope_scaling or "type" not in rope_scaling else "type"
    rope_type, factor = rope_scaling.get(name), rope_scaling.get("factor")
    if not isinstance(rope_type, str) or factor is None:
        raise ConfigError(
            f"{key} = {shown} is not accepted; accepted: empty, or a rope_type ({', '.join(ROPE_TYPES)}) with a "
            "factor > 0, e.g. {rope_type: yarn, factor: 2.5, original_max_position_embeddings: 32768}"
        )
    if rope_type not in ROPE_TYPES:
        accepted = f"{', '.join(ROPE_TYPES)}{did_you_mean(rope_type, list(ROPE_TYPES))}"
        raise ConfigError(f"{part(name)} = {rope_type!r} is not accepted; accepted: {accepted}")
    if not finite(factor) or factor <= 0:
        raise ConfigError(f"{part('factor')} = {factor!r} is not accepted; accepted: a finite number > 0")
    original = rope_scaling.get("original_max_position_embeddings", 1)
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise ConfigError(
            f"{part('original_max_position_embeddings')} = {original!r} is not accepted; accepted: an integer >= 1 "
            "(or none: the model's)"
        )


def check_sft(config: DictConfig) -> None:
    """The SFT layout named by ``data.sft_layout`` exists."""
    from klear.data.sft_layouts import LAYOUTS

    name = config.data.sft_layout
    if name and name not in LAYOUTS:
        known = f"known: {', '.join(LAYOUTS)}, or empty to detect it{did_you_mean(name, list(LAYOUTS))}"
        raise ConfigError(f"data.sft_layout = {name!r} is not a known layout; {known}")


STAGE_CHECKS: dict[str, list] = {"rl": [check_rl], "sft": [check_sft]}
"""Stage name -> extra check functions ``(config) -> None`` that raise :class:`ConfigError`."""


def save_config(config: DictConfig, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(OmegaConf.to_yaml(config, resolve=True))


def _check_fields(node: Any, schema: type, prefix: str) -> None:
    """Every field's ``choices`` and ``range`` metadata, recursively, naming the first key that breaks one."""
    sections = _sections(schema)
    for field in dataclasses.fields(schema):
        value = node[field.name]
        key = f"{prefix}{field.name}"
        if "choices" in field.metadata and value not in field.metadata["choices"]:
            accepted = ", ".join(map(str, field.metadata["choices"]))
            raise ConfigError(f"{key} = {value!r} is not accepted; accepted: {accepted}")
        if "range" in field.metadata and value not in field.metadata["range"]:
            finite = not isinstance(value, float) or math.isfinite(value)
            kind = "an integer" if field.type in (int, "int") else "a number" if finite else "a finite number"
            why = f" ({field.metadata['why']})" if "why" in field.metadata and finite else ""
            raise ConfigError(f"{key} = {value!r} is not accepted; accepted: {kind} {field.metadata['range']}{why}")
        if field.name in sections and value is not None:  # None: a section that may be null (model.lora)
            _check_fields(value, sections[field.name], prefix=f"{key}.")


def _check_shapes(layer: dict, schema: type, prefix: str) -> None:
    """What the merge fails on without naming the key and the shape, named with the shape accepted: a section, a
    mapping or a list given something else (``rollout: 5``, ``objective=[1]``, ``optim.betas={a: 1}``), a list of
    the wrong length or items (``optim.betas=[0.9]``, ``[a, b]``), a number a float cannot hold."""
    hints, sections = typing.get_type_hints(schema), _sections(schema)
    fields = {field.name: field for field in dataclasses.fields(schema)}
    for name, value in layer.items():
        key = f"{prefix}{name}"
        if name in sections:
            if value is None and _nullable(hints[name]):
                continue
            if not isinstance(value, dict):
                example = dataclasses.fields(sections[name])[0].name
                raise ConfigError(
                    f"{key} = {value!r} is not accepted; accepted: a section of keys, e.g. {key}.{example}=... "
                    f"(klear fit --help-config {key} lists them)"
                )
            _check_shapes(value, sections[name], prefix=f"{key}.")
            continue
        if name not in hints or value is None or interpolation(value):
            continue
        if accepted := shape_problem(value, hints[name], fields[name].metadata):
            accepted = _levels_accepted() if key == "data.levels" else accepted  # the tasks' levels
            raise ConfigError(f"{key} = {value!r} is not accepted; accepted: {accepted}")


def _check_lora(lora: DictConfig | None) -> None:
    """``model.lora`` needs PEFT, target modules, and an ``adapter`` that is a PEFT adapter folder; the target
    modules are checked against the model's layers by `klear.run.preflight`."""
    if lora is None:
        return
    if importlib.util.find_spec("peft") is None:
        raise ConfigError("model.lora needs the peft package: pip install -e '.[lora]'")
    if not lora.target_modules:
        raise ConfigError("model.lora.target_modules = [] is not accepted; accepted: layer names, or [all-linear]")
    if lora.adapter and not (Path(lora.adapter) / "adapter_config.json").is_file():
        raise ConfigError(
            f"model.lora.adapter = {lora.adapter!r} is not a PEFT adapter folder (no adapter_config.json there); "
            "give the adapter/ folder of a LoRA run"
        )


def _nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _check_prompt_format(data: DictConfig) -> None:
    """``data.prompt_template`` holds ``{prompt}`` once; a system prompt goes with the chat template."""
    from klear.data.prompts import PromptFormat

    if (problem := PromptFormat.of(data).problem()) is not None:
        field, reason = problem
        key = {"template": "prompt_template", "system": "system_prompt"}[field]
        fix = "; write it into data.prompt_template instead" if field == "system" else ""
        raise ConfigError(f"data.{key} = {data[key]!r}: {reason}{fix}")


def _check_sets(data: DictConfig) -> None:
    """``data.train`` and ``data.eval`` are each a source, a list of sources or a mapping of names to sources
    (`klear.data.sets`)."""
    from klear.data.sets import sets_problem

    for split in ("train", "eval"):
        value = _sets_value(data, split)
        if problem := sets_problem(value, split):
            raise ConfigError(f"data.{split} = {value!r} {problem}")


def _sets_value(data: DictConfig, split: str) -> Any:
    """``data.<split>`` as plain Python: a string, a list or a dict."""
    value = data[split]
    return value if isinstance(value, str) else OmegaConf.to_container(value)


def _data_sources(data: DictConfig) -> list[tuple[str, str]]:
    """``(key, source)`` of every data source of ``data``: each of ``data.train``'s sets, then ``data.eval``'s."""
    from klear.data.sets import named_sets

    pairs = []
    for split in ("train", "eval"):
        value = _sets_value(data, split)
        sets = named_sets(value, split)
        listed = isinstance(value, list)
        keys = [f"{split}[{i}]" if listed else f"{split}.{name}" if name else split for i, name in enumerate(sets)]
        pairs += zip(keys, sets.values(), strict=True)
    return pairs


def _check_levels(data: DictConfig) -> None:
    from klear.data import synthetic, synthetic_code

    levels = OmegaConf.to_container(data.levels)
    for _, source in _data_sources(data):
        task = {"synthetic": synthetic, "synthetic-code": synthetic_code}.get(source)
        known = task.LEVELS if task else synthetic.LEVELS
        unknown = [level for level in levels if not isinstance(level, int) or (task is not None and level not in known)]
        if unknown or not levels:
            raise ConfigError(f"data.levels = {levels} is not accepted; accepted: {_levels_accepted(known)}")


def _levels_accepted(known: collections.abc.Iterable[int] | None = None) -> str:
    from klear.data import synthetic

    return f"a list of {', '.join(map(str, sorted(synthetic.LEVELS if known is None else known)))}"


def _check_synthetic_rewards(config: DictConfig) -> None:
    """A built-in task is checked by its own reward (``synthetic``: math, ``synthetic-code``: code)."""
    from klear.data.problems import SYNTHETIC_REWARDS

    reward_key = "reward.name" if config.stage == "rl" else "eval.reward"
    reward = config.reward.name if config.stage == "rl" else config.eval.reward
    task_of = {checked_by: task for task, checked_by in SYNTHETIC_REWARDS.items()}
    for key, source in _data_sources(config.data):
        if key.startswith("train") and config.stage != "rl":
            continue
        wanted = SYNTHETIC_REWARDS.get(source)
        if wanted and reward in SYNTHETIC_REWARDS.values() and reward != wanted:
            raise ConfigError(
                f"data.{key}={source} is checked by the {wanted} reward, not {reward}; set "
                f"{reward_key}={wanted}, or data.{key}={task_of[reward]} (or a file of {reward} problems)"
            )


def _check_call(prefix: str, component: Any, values: dict[str, Any], name: str) -> Any:
    """Build ``component(**values)`` (a class or a function taking options after its two arguments) after checking
    each value against its parameter's annotation, so a wrong type names ``prefix.key`` instead of failing inside.
    Returns the built instance of a class (``None`` for a function, which is only checked)."""
    target = component.__init__ if isinstance(component, type) else component
    parameters = list(inspect.signature(target).parameters.values())[1 if isinstance(component, type) else 2 :]
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations of a user's component: only its own checks apply
        hints = {}
    for key, value in values.items():
        if key not in accepted and not takes_any:
            what = "hyperparameter" if prefix == "objective" else "option"
            raise ConfigError(
                f"{prefix.split('.')[0]} {name!r} has no {what} {key!r}; accepted: {', '.join(accepted) or '(none)'}"
                f"{did_you_mean(key, accepted)}"
            )
        if key in hints and not _matches(value, hints[key]):
            raise ConfigError(f"{prefix}.{key} = {value!r} is not accepted; accepted: {_type_name(hints[key])}")
    if not isinstance(component, type):
        return None
    try:
        return component(**values)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{prefix.split('.')[0]} {name!r}: {_first_line(error)}") from error


def _matches(value: Any, hint: Any) -> bool:
    """Whether a config value fits a simple annotation (numbers, str, bool, None, unions, containers)."""
    origin = typing.get_origin(hint)
    if hint is typing.Any or isinstance(hint, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if origin in (list, tuple, collections.abc.Sequence):
        return isinstance(value, list | tuple)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    return True  # anything richer is left to the component's own checks


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    names = {float: "a number", int: "an integer", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _sections(schema: type) -> dict[str, type]:
    """Field name -> dataclass type, for the fields of ``schema`` that are config sections (``model.lora``, a
    section that may be null, included)."""
    sections = {}
    for name, hint in typing.get_type_hints(schema).items():
        kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)] or [hint]
        if len(kinds) == 1 and dataclasses.is_dataclass(kinds[0]):
            sections[name] = kinds[0]
    return sections


def _explain(error: OmegaConfBaseException, stage: str) -> str:
    key = getattr(error, "full_key", None)
    if isinstance(error, ConfigKeyError) and key:
        parent, _, name = key.rpartition(".")
        accepted = _accepted_keys(SCHEMAS[stage], parent)
        where = f"section '{parent}'" if parent else f"stage {stage!r}"
        close = did_you_mean(name, accepted, prefix=f"{parent}." if parent else "")
        return f"unknown config key '{key}'; accepted keys of {where}: {', '.join(accepted)}{close}"
    if key:
        return f"bad value for '{key}': {_first_line(error)}"
    return f"bad config: {_first_line(error)}"


def _accepted_keys(schema: type, dotted: str) -> list[str]:
    for part in [p for p in dotted.split(".") if p]:
        if part not in _sections(schema):
            return []
        schema = _sections(schema)[part]
    return [field.name for field in dataclasses.fields(schema)]


def _yaml_problem(error: BaseException) -> str:
    """What the YAML parser objects to and where: ``line 3, column 9: expected ',' or ']', but got ...``."""
    parts = []
    for text, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        said, where = getattr(error, text, None), getattr(error, mark, None)
        if said:
            parts.append(
                " ".join(str(said).split()) + (f" (line {where.line + 1}, column {where.column + 1})" if where else "")
            )
    return ": ".join(parts) or _first_line(error)


def _first_line(error: BaseException) -> str:
    """The first line of OmegaConf's own message (``msg``, without the context its ``str()`` appends), else of
    ``error``'s."""
    message = getattr(error, "msg", None)
    return first_line(ValueError(message) if message else error)
