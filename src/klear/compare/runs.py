"""One run of a comparison: an objective x variant x seed, and where its files are."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    """One objective x variant x seed."""

    label: str
    objective: str
    seed: int
    overrides: list[str] = field(default_factory=list)
    directory: Path = Path()

    @property
    def finished(self) -> bool:
        return (self.directory / "done.json").is_file()

    @property
    def wall_seconds(self) -> float:
        path = self.directory / "wall.json"
        return json.loads(path.read_text())["seconds"] if path.is_file() else 0.0
