"""Whether ``model.path`` (or ``--model``, ``--base``) can name a model, checked before anything heavy is imported:
a built-in model, a Hugging Face model folder or hub name, a PEFT adapter folder over its base model, or a run's
checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from klear.errors import first_line
from klear.runtime.checkpoint_files import checkpoint_problem, is_run_checkpoint
from klear.schema.sections import is_hub_name

BUILTIN_MODELS = ("tiny", "tiny-sft", "tiny-sft-code", "tiny-sft-testbed")
"""``model.path`` values of the built-in models (see `klear.models`)."""


def model_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a model, when it can only be a local path (hub names are ``name`` or ``org/name``)
    and holds no model directory; None when it may be one (a hub name is only checked when it is loaded). A PEFT
    adapter folder (a LoRA run's ``adapter/``) is a model when the base model it names is one; a run's checkpoint
    when it is complete (what it holds is checked when it is exported)."""
    if path in BUILTIN_MODELS:
        return None
    local = Path(path).expanduser()
    if is_run_checkpoint(local):  # a run's checkpoint, a model too (`klear.models.run_checkpoint`)
        problem = checkpoint_problem(local)
        return f"a damaged checkpoint ({problem})" if problem else None
    if is_adapter_folder(path):
        return _adapter_base_problem(local / ADAPTER_CONFIG)
    looks_local = not is_hub_name(path)
    if looks_local and not (local / "config.json").is_file():
        return (
            "no model directory there (a folder with config.json); give a Hugging Face model directory or hub "
            f"name, a run's checkpoint (<output_dir>/checkpoints/step-N.ckpt), or a built-in model: "
            f"{', '.join(BUILTIN_MODELS)}"
        )
    if looks_local:  # transformers picks the model's classes by config.json's model_type, and has no other way
        try:
            fields = json.loads((local / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"{local / 'config.json'} cannot be read as JSON ({first_line(error)})"
        if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
            return (
                f"{local / 'config.json'} has no model_type, which transformers reads the architecture from; "
                'add it (e.g. "model_type": "qwen3"), or give the folder of a saved model'
            )
    return None


ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a folder a PEFT adapter folder (`klear.models.lora` loads it)."""


def is_adapter_folder(path: str) -> bool:
    """Whether ``path`` is a PEFT adapter folder: a folder with an ``adapter_config.json``."""
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def _adapter_base_problem(file: Path) -> str | None:
    """Why the adapter folder of ``file`` (its ``adapter_config.json``) cannot be loaded over the base model it
    names (``base_model_name_or_path``); None when that base may be a model."""
    try:
        fields = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{file} cannot be read as JSON ({first_line(error)})"
    base = fields.get("base_model_name_or_path") if isinstance(fields, dict) else None
    if not isinstance(base, str) or not base:
        return f"{file} names no base model (base_model_name_or_path)"
    problem = model_path_problem(base)
    return f"the base model {base} that {file} names: {problem}" if problem else None
