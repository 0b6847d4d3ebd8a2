"""``--help-config [SECTION]``: every key of a resolved run config with its type, value, default and doc.

The docs are the attribute docstrings written right under each field of the schema's dataclasses
(:mod:`klear.schema`). Python keeps no attribute docstrings at run time, so they are read from the
dataclasses' source with :mod:`ast`; the first sentence is shown, and a field without one shows none. The value
is the config's (after its YAML and ``key=value`` overrides), the default the stage's dataclass default. The
free-form ``objective`` section lists the chosen objective's constructor arguments: their defaults from the
signature, their docs from the first ``Args:`` entry of each in the class hierarchy, base class first.

Nothing heavy is imported here; the objectives are imported for the ``objective`` section (the RL stage's config
check has imported them already). Nested sections print as dotted keys
(``rollout.vllm.dtype``); SECTION may be a section (``rollout``, ``rollout.vllm``) or a single key.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import shutil
import sys
import textwrap
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from klear.config.load import ConfigError, did_you_mean
from klear.schema import SCHEMAS

COLUMNS = ("key", "type", "value", "default", "doc")
MIN_DOC_WIDTH = 40
"""Fewest characters the doc column gets beside the others before the docs move under their rows."""


@dataclasses.dataclass(frozen=True)
class KeyHelp:
    """One row of ``--help-config``: a dotted key and its type, value, default and doc, as printed."""

    key: str
    type: str
    value: str
    default: str
    doc: str


def config_help(config: DictConfig, section: str = "", width: int | None = None) -> str:
    """The aligned table of :func:`key_help`; the doc column is wrapped to ``width`` characters when given."""
    return format_table(key_help(config, section), width)


def key_help(config: DictConfig, section: str = "") -> list[KeyHelp]:
    """The rows of every key of ``config``, or of those under ``section`` (a section or a single key)."""
    schema = SCHEMAS[config.stage]
    values = OmegaConf.to_container(config, resolve=True)
    defaults = OmegaConf.to_container(OmegaConf.structured(schema), resolve=True)
    rows = _rows(schema, values, defaults, prefix="")
    if not section:
        return rows
    chosen = [row for row in rows if row.key == section or row.key.startswith(f"{section}.")]
    if not chosen:
        names = sections(schema)
        raise ConfigError(
            f"--help-config {section!r} is no section or key of stage {config.stage!r}; sections: "
            f"{', '.join(names)}{did_you_mean(section, names + [row.key for row in rows])}"
        )
    return chosen


def sections(schema: type, prefix: str = "") -> list[str]:
    """Dotted names of the sections of ``schema`` (its dataclass fields, nested ones too, and ``objective``)."""
    names = []
    for field in dataclasses.fields(schema):
        nested = _section_type(schema, field.name)
        if nested is not None:
            names += [f"{prefix}{field.name}", *sections(nested, f"{prefix}{field.name}.")]
        elif not prefix and field.name == "objective":
            names.append(field.name)
    return names


def format_table(rows: list[KeyHelp], width: int | None = None) -> str:
    """Columns padded to their longest cell, the doc last. With a ``width``, the doc wraps under itself; where
    fewer than ``MIN_DOC_WIDTH`` characters would be left for it, each doc goes on indented lines under its row."""
    table = [[getattr(row, name) for name in COLUMNS] for row in [KeyHelp(*map(str.upper, COLUMNS)), *rows]]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(COLUMNS) - 1)]
    doc_column = sum(widths) + 2 * len(widths)
    below = width is not None and width - doc_column < MIN_DOC_WIDTH
    lines = []
    for cells in table:
        start = "  ".join(cell.ljust(size) for cell, size in zip(cells[:-1], widths, strict=True))
        doc = cells[-1]
        if width is None:
            lines.append(f"{start}  {doc}".rstrip())
        elif below:
            lines += [
                start.rstrip(),
                *textwrap.wrap(doc, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False),
            ]
        else:
            wrapped = textwrap.wrap(doc, width - doc_column, break_on_hyphens=False) or [""]
            lines += [f"{start}  {wrapped[0]}".rstrip(), *(" " * doc_column + more for more in wrapped[1:])]
    return "\n".join(lines)


def terminal_width() -> int | None:
    """The terminal's width when standard output is one; None (no wrapping) when it is piped or redirected."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _rows(schema: type, values: dict, defaults: dict, prefix: str) -> list[KeyHelp]:
    docs = field_docs(schema)
    rows = []
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        nested = _section_type(schema, field.name)
        if nested is not None and type(None) in typing.get_args(_hints(schema)[field.name]):
            # A section that may be null (model.lora): its own row, then its keys as they are once it is set.
            value, default = values[field.name], defaults[field.name]
            doc = docs.get(field.name, "")
            rows.append(KeyHelp(key, "section or null", show(value), show(default), doc))
            unset = OmegaConf.to_container(OmegaConf.structured(nested), resolve=True)
            rows += _rows(nested, value or unset, default or unset, prefix=f"{key}.")
        elif nested is not None:
            rows += _rows(nested, values[field.name], defaults[field.name], prefix=f"{key}.")
        elif not prefix and field.name == "objective":
            rows += _objective_rows(values[field.name], defaults[field.name], docs.get(field.name, ""))
        else:
            kind = _type_name(field.type) + _accepted(field.metadata)
            value, default = show(values[field.name]), show(defaults[field.name])
            rows.append(KeyHelp(key, kind, value, default, docs.get(field.name, "")))
    return rows


def _objective_rows(values: dict, defaults: dict, doc: str) -> list[KeyHelp]:
    """``objective.name``, then the chosen objective's hyperparameters, set or not, with its constructor defaults
    (a user's objective may take more through ``**kwargs``: those set show no type or default)."""
    from klear.objectives import objective_class, objective_defaults

    empty = inspect.Parameter.empty
    name = values["name"]
    rows = [KeyHelp("objective.name", "str", show(name), show(defaults["name"]), doc)]
    parameters = inspect.signature(objective_class(name).__init__).parameters
    signature_defaults = objective_defaults(name)  # a required hyperparameter's default is `empty`
    docs = _argument_docs(objective_class(name))
    for key in [*signature_defaults, *(key for key in values if key != "name" and key not in signature_defaults)]:
        annotation = parameters[key].annotation if key in parameters else empty
        default = signature_defaults.get(key, empty)
        value = values.get(key, default)
        kind = "" if annotation is empty else _type_name(annotation)
        shown = ["" if item is empty else show(item) for item in (value, default)]
        rows.append(KeyHelp(f"objective.{key}", kind, *shown, docs.get(key, "")))
    return rows


@functools.cache
def field_docs(schema: type) -> dict[str, str]:
    """Field name -> first sentence of the docstring right under it, for ``schema`` and its dataclass bases."""
    docs: dict[str, str] = {}
    for cls in reversed(schema.__mro__[:-1]):  # a subclass's doc of a field replaces its base's
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):  # no source (a class built at run time): its fields show no doc
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = first_sentence(after.value.value)
    return docs


def _argument_docs(cls: type) -> dict[str, str]:
    """Argument name -> first sentence of its ``Args:`` entry, from the class that introduces it (base first)."""
    from klear.objectives import Objective

    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if issubclass(base, Objective) and base.__doc__:
            for name, text in args_section(inspect.cleandoc(base.__doc__)).items():
                docs.setdefault(name, first_sentence(text))
    return docs


def args_section(docstring: str) -> dict[str, str]:
    """The entries of a Google-style ``Args:`` block: ``name: text``, continued on lines indented deeper."""
    lines = docstring.splitlines()
    stripped = [line.strip() for line in lines]
    if "Args:" not in stripped:
        return {}
    block = lines[stripped.index("Args:") + 1 :]
    indent = len(block[0]) - len(block[0].lstrip()) if block else 0
    entries: dict[str, str] = {}
    current = None
    for line in block:
        depth = len(line) - len(line.lstrip())
        if not line.strip() or depth < indent or indent == 0:
            break  # a blank line or a dedent ends the block
        entry = re.fullmatch(r"(\w+)(?: \([^)]*\))?:\s*(.*)", line.strip()) if depth == indent else None
        if entry:
            current = entry.group(1)
            entries[current] = entry.group(2)
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def first_sentence(text: str) -> str:
    """The first sentence of a docstring, on one line, without reST markup (``x`` and :role:`x` become x)."""
    text = re.sub(r":\w+:`~?([^`]*)`", r"\1", text)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    paragraph = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    return re.split(r"(?<=[.!?])(?<!e\.g\.)(?<!i\.e\.)\s+", " ".join(paragraph.split()), maxsplit=1)[0]


def show(value: Any) -> str:
    """A config value as YAML writes it in flow style: null, true, [1, 2], {correct: 1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(show, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {show(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str):
        return value or "''"
    return str(value)


def _accepted(metadata: Any) -> str:
    """What ``choice(...)`` and the number helpers of the schema accept, after the type: ``int >= 1``."""
    if "choices" in metadata:
        return ": " + "|".join(map(show, metadata["choices"]))
    if "range" in metadata:
        return f" {metadata['range']}"
    return ""


def _type_name(annotation: Any) -> str:
    """An annotation as written (``list[int]``, ``bool | None``), also when it is an object, not a string."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _section_type(schema: type, name: str) -> type | None:
    """The dataclass of field ``name`` of ``schema`` when that field is a section, else None."""
    hint = _hints(schema)[name]
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)] or [hint]  # X | None: X
    return kinds[0] if len(kinds) == 1 and dataclasses.is_dataclass(kinds[0]) else None


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def markdown_reference() -> str:
    """Every key of both stages as Markdown tables (key, type, default, doc), for ``docs/configuration.md``
    (``python tools/config_reference.py`` writes it there; a test keeps the page in sync)."""
    parts = []
    for stage, schema in SCHEMAS.items():
        rows = key_help(OmegaConf.structured(schema))
        parts.append(f"### `stage: {stage}`\n")
        parts.append("| key | type | default | doc |\n|---|---|---|---|")
        parts += [f"| `{row.key}` | {_cell(row.type)} | `{row.default}` | {_cell(row.doc)} |" for row in rows]
        parts.append("")
    return "\n".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
