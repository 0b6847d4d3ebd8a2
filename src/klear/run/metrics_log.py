"""``<output_dir>/metrics.csv``: one row per logged step, in Lightning's CSV layout, kept whole across resumes.

Metrics are written by :class:`MetricsCSVLogger` rather than Lightning's ``CSVLogger`` for one reason: resume.
Lightning's writer deletes an existing ``metrics.csv`` when it starts, and rows logged after the last checkpoint
would otherwise appear twice. This logger keeps the rows of the steps before the checkpoint and drops the rest,
so a resumed run's file reads as if the run had never stopped.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from klear.run.directory import with_path


class MetricsCSVLogger(Logger):
    """``<root>/metrics.csv`` in Lightning's CSV layout; on resume, rows at or after ``resume_step`` are dropped."""

    def __init__(self, root: str | Path, resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(root) / "metrics.csv"
        self.keys: list[str] = []
        self.rows: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as file:
                reader = csv.DictReader(file)
                self.keys = list(reader.fieldnames or [])
                self.rows = [row for row in reader if int(row["step"]) < resume_step]
            self._rewrite()
        elif self.path.exists():
            self.path.unlink()

    @property
    def name(self) -> str:
        return "metrics"

    @property
    def version(self) -> str:
        return ""

    @property
    def root_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The resolved config is saved as ``config.yaml`` by the run itself."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        row = {key: float(value) for key, value in metrics.items()}
        row["step"] = len(self.rows) if step is None else int(step)
        self.rows.append(row)
        if set(row) - set(self.keys):
            self.keys = sorted(set(self.keys) | set(row))
            self._rewrite()
        else:
            try:
                with self.path.open("a", newline="") as file:
                    csv.DictWriter(file, fieldnames=self.keys).writerow(row)
            except OSError as error:  # a full disk: the run's one line names this file
                raise with_path(error, self.path) from error

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        try:
            with temporary.open("w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.keys)
                writer.writeheader()
                writer.writerows(self.rows)
        except OSError as error:
            temporary.unlink(missing_ok=True)  # the file in place stays whole
            raise with_path(error, self.path) from error
        os.replace(temporary, self.path)
