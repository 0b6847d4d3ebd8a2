"""Run configuration: loading with validation (`klear.config.load`: YAML + dotted overrides, unknown keys, bad
values and names no registry knows as one-line errors, before any heavy import) and the ``--help-config`` table of
a config's keys (`klear.config.help`). The schema of every key is `klear.schema`, the bottom layer; its
dataclasses are importable from here too: ``from klear.config import RLRunConfig``."""

from klear import schema
from klear.schema import *  # noqa: F403  (the schema's names, re-exported)

__all__ = list(schema.__all__)
