"""The output directory of a run: its paths, the checks that it may be written (or resumed), and the record of
the data it trains on.

Layout of ``<output_dir>``::

    config.yaml            the resolved config of the run
    data_report.json       the data sources: rows read, problems used, every skipped row by file and line, and a
                           digest of the content, which ``--resume`` checks
    metrics.csv            one row per logged step (Lightning's CSV layout: sorted columns, a ``step`` column)
    checkpoints/step-000040.ckpt  the latest resumable checkpoint (model, optimizer, scheduler, data position),
                           named after the number of steps it completed
    hf/                    the final model, tokenizer and generation config in Hugging Face format

This module imports nothing heavy, so that a bad ``output_dir`` is reported as fast as a bad config key; the
logger and checkpoint callback that write into the directory are in :mod:`klear.runtime.checkpoints`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT_GLOB = "step-*.ckpt"


class RunError(ValueError):
    """A run that cannot start as asked (output directory, resume): one line that says what to do."""


class RunDir:
    """Paths of one run's output directory."""

    def __init__(self, root: str | Path, resume: bool = False) -> None:
        self.root = Path(root)
        self.resume = resume
        """Whether this run continues the one in ``root`` (``--resume``)."""
        self.config = self.root / "config.yaml"
        self.metrics = self.root / "metrics.csv"
        self.checkpoints = self.root / "checkpoints"
        self.hf = self.root / "hf"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}.ckpt"

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (a checkpoint is only ever renamed into place whole), or None."""
        found = sorted(self.checkpoints.glob(CHECKPOINT_GLOB))
        return found[-1] if found else None

    def resume_step(self) -> int:
        """The step the last checkpoint resumes at (steps completed before it)."""
        return int(self.last_checkpoint.stem.removeprefix("step-"))

    def holds_a_run(self) -> bool:
        return self.last_checkpoint is not None or self.metrics.exists()

    @property
    def data_report(self) -> Path:
        return self.root / "data_report.json"

    def check_writable(self) -> None:
        """Raise `RunError` when ``output_dir`` is a file or a directory this process cannot write into."""
        if self.root.exists() and not self.root.is_dir():
            raise RunError(f"output_dir {str(self.root)!r} is a file, not a directory; set output_dir=...")
        probe = self.root / f".klear-write-probe-{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            raise RunError(
                f"output_dir {str(self.root)!r} is not writable ({error.strerror or error}); set output_dir=..."
            ) from None

    def record_data(self, report: dict[str, Any]) -> None:
        """Write ``data_report.json``; on ``--resume``, first refuse data whose content changed since the run began
        (the data position in the checkpoint indexes the old rows, so other rows would train silently)."""
        if self.resume and self.data_report.is_file():
            before = json.loads(self.data_report.read_text())
            for name, source in report.items():
                old = before.get(name, {})
                if old.get("digest") not in (None, source["digest"]):
                    raise RunError(
                        f"--resume: the {name} data ({source['source']}) differs from the data the run started on "
                        f"({old.get('source')}: {old.get('problems', old.get('examples'))} items, now "
                        f"{source.get('problems', source.get('examples'))}; content digest {old['digest']} != "
                        f"{source['digest']}); resume with the same data, or start a new run in another output_dir"
                    )
        temporary = self.data_report.with_name(f".{self.data_report.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
        os.replace(temporary, self.data_report)


def remove_path(path: Path) -> None:
    """Remove a file or a directory (a sharded checkpoint); nothing when it does not exist."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
