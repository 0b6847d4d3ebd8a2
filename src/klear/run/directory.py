"""The output directory of a run: its paths, the checks that it may be written (or resumed), and the record of
the data it trains on.

Layout of ``<output_dir>``::

    config.yaml            the resolved config of the run
    data_report.json       the data sources: rows read, problems used, every skipped row by file and line, and a
                           digest of the content, which ``--resume`` checks
    metrics.csv            one row per logged step (Lightning's CSV layout: sorted columns, a ``step`` column)
    samples.jsonl          what the model wrote at each evaluation (``logging.samples``: `klear.run.samples_log`)
    checkpoints/step-000040.ckpt  the latest resumable checkpoint (model, optimizer, scheduler, data position),
                           named after the number of steps it completed (``trainer.keep_checkpoints``: the newest
                           N stay), each a model too (`klear.models.run_checkpoint`)
    hf/                    the final model, tokenizer and generation config in Hugging Face format
    .klear.lock            while a run is live: the lock that keeps a second run out (`klear.run.folder_lock`);
                           removed when the run ends, left behind only by a run killed outright

This module imports nothing heavy, so that a bad ``output_dir`` is reported as fast as a bad config key; the
logger and checkpoint callback that write into the directory are in :mod:`klear.run.checkpoints`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

from klear.data.readers import written
from klear.errors import UserError
from klear.run.folder_lock import LOCK_NAME, FolderLock
from klear.runtime.checkpoint_files import checkpoint_problem

CHECKPOINT_GLOB = "step-*.ckpt"
ELSEWHERE = "set output_dir=..."


class RunError(UserError):
    """A run that cannot start as asked (output directory, resume): one line that says what to do."""


class RunDir:
    """Paths of one run's output directory."""

    def __init__(self, root: str | Path, resume: bool = False) -> None:
        self.root = Path(root)
        self.resume = resume
        """Whether this run continues the one in ``root`` (``--resume``)."""
        self.config = self.root / "config.yaml"
        self.metrics = self.root / "metrics.csv"
        self.samples = self.root / "samples.jsonl"
        self.checkpoints = self.root / "checkpoints"
        self.hf = self.root / "hf"
        self.adapter = self.root / "adapter"
        """A LoRA run's adapters, in PEFT's format (``hf`` holds the merged model)."""
        self.lock: FolderLock | None = None
        """The lock this process holds on the directory (``klear.fit``'s first process), released at the end."""

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}.ckpt"

    def saved_checkpoints(self) -> list[Path]:
        """The checkpoints in ``checkpoints/``, oldest step first (a checkpoint is only ever renamed into place
        whole; ``trainer.keep_checkpoints`` says how many stay)."""
        found = [path for path in self.checkpoints.glob(CHECKPOINT_GLOB) if checkpoint_step(path) is not None]
        return sorted(found, key=checkpoint_step)

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.saved_checkpoints()
        return found[-1] if found else None

    def resume_step(self) -> int:
        """The step the last checkpoint resumes at (steps completed before it)."""
        return checkpoint_step(self.last_checkpoint)

    def check_resumable(self) -> None:
        """Raise `RunError` when the last checkpoint cannot be resumed (missing, or cut short by a full disk or a
        copy that stopped), naming an earlier complete checkpoint when one is kept. Reads only the file's index:
        called before anything of the run is touched, so that a refused resume changes nothing."""
        last = self.last_checkpoint
        if last is None and self.metrics.exists():  # stopped (or killed) before its first checkpoint was whole
            raise RunError(
                f"--resume: no complete checkpoint in {self.checkpoints}: the run stopped before its first one was "
                "saved, so nothing can be resumed; start it again with --overwrite, or set output_dir=..."
            )
        if last is None:
            raise RunError(f"--resume: no checkpoint in {self.checkpoints}; start the run without --resume")
        problem = checkpoint_problem(last)
        if problem is None:
            return
        earlier = [path for path in self.saved_checkpoints() if path != last]
        complete = [path for path in earlier if checkpoint_problem(path) is None]
        if complete:
            advice = f"the earlier checkpoint {complete[-1]} is complete: remove {last} and resume again"
        else:
            advice = (
                "no earlier complete checkpoint is kept (trainer.keep_checkpoints=N keeps the newest N): start the "
                "run again with --overwrite, or set output_dir=..."
            )
        raise RunError(f"--resume: {last} is damaged ({problem}); {advice}")

    def holds_a_run(self) -> bool:
        return self.last_checkpoint is not None or self.metrics.exists()

    @property
    def data_report(self) -> Path:
        return self.root / "data_report.json"

    def check_writable(self) -> None:
        """Raise `RunError` when ``output_dir`` is a file or a directory this process cannot write into."""
        self._refuse_a_file()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            write_probe(self.root)
        except OSError as error:
            raise self._not_writable(error) from None

    def take_lock(self, command: str) -> FolderLock:
        """Hold the directory for ``command`` (`klear.run.folder_lock`; made when missing), or raise `RunError`
        (a file, not writable) or `FolderInUse` (another live command holds it), before anything in it is read."""
        self._refuse_a_file()
        try:
            return FolderLock.take(self.root / LOCK_NAME, command, f"output_dir {str(self.root)!r}", ELSEWHERE)
        except OSError as error:
            raise self._not_writable(error) from None

    def _refuse_a_file(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise RunError(f"output_dir {str(self.root)!r} is a file, not a directory; {ELSEWHERE}")

    def _not_writable(self, error: OSError) -> RunError:
        return RunError(f"output_dir {str(self.root)!r} is not writable ({error.strerror or error}); {ELSEWHERE}")

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
            if (started := _train_sets(before)) and started != (now := _train_sets(report)):
                raise RunError(
                    f"--resume: data.train is {now}; the run started on {started}, and its data position counts "
                    "through those sets' problems in that order: resume with the same data.train, or start a new run "
                    "in another output_dir"
                )
        text = json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n"
        try:
            written(self.data_report, lambda path: path.write_text(text))
        except OSError as error:  # a full disk before the first step: one line, not a model that "cannot be loaded"
            raise RunError(write_failure(error, self.root)) from None


def _train_sets(report: dict[str, Any]) -> str:
    """The sets of ``data.train`` a data report records, in order (``one source``, or ``the sets a, b``), or "" for
    a report without any."""
    names = [key.removeprefix("train/") for key in report if key.startswith("train/")]
    if not names:
        return "one source" if "train" in report else ""
    return f"the set{'s' if len(names) > 1 else ''} {', '.join(names)}"


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint's name says it completed (``step-000040.ckpt``: 40), or None for another name."""
    digits = path.stem.removeprefix("step-")
    return int(digits) if path.stem.startswith("step-") and digits.isdigit() else None


WRITE_HINTS = {
    errno.ENOSPC: "free space on that filesystem or {move} to another one",
    errno.EDQUOT: "free space within your disk quota or {move} to another filesystem",
    errno.EFBIG: "raise the file size limit (ulimit -f) or {move} to another filesystem",
    errno.EROFS: "{move} to a writable filesystem",
}
"""What to do about an ``OSError`` that stopped a write, by ``errno``; ``{move}`` names the setting that puts the
output elsewhere."""


def write_failure(error: OSError, root: Path, move: str = "set output_dir=...") -> str:
    """The one line (without ``error: ``) that reports ``error`` raised writing a file of the run in ``root`` (or
    of a command's output there, ``move`` naming the option that moves it: ``set --out``)."""
    reason = error.strerror or type(error).__name__
    reason = reason[0].lower() + reason[1:]
    where = error.filename if error.filename is not None else f"the run's files in {root}"
    hint = WRITE_HINTS.get(error.errno, "make {root} writable or {move}").format(root=root, move=move)
    return f"{reason} writing {where}; {hint}"


def with_path(error: OSError, path: Path) -> OSError:
    """``error`` naming ``path`` (a failed ``write`` or ``close`` names no file), so that the run's one line can."""
    if error.filename is not None:
        return error
    named = OSError(error.errno, error.strerror or str(error), str(path))
    named.__cause__ = error
    return named


def write_probe(folder: Path) -> None:
    """Create and remove a file in ``folder``; an `OSError` when this process cannot write there. Permission bits
    (``os.access``) do not tell: root passes them on read-only mounts and on ``/proc``."""
    probe = folder / f".klear-write-probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def folder_problem(folder: Path) -> str | None:
    """Why this process cannot write into ``folder``, made with any missing folders above it (``mkdir -p``), as a
    phrase to follow the path asked for: the nearest existing one is a broken symbolic link, a file, or not
    writable; None when it can."""
    while not folder.exists():
        if folder.is_symlink():  # a dangling link: mkdir fails on it
            return f"{folder} is a broken symbolic link"
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    try:
        write_probe(folder)
    except OSError as error:
        return f"the folder {folder} is not writable ({error.strerror or error})"
    return None


def remove_path(path: Path) -> None:
    """Remove a file or a directory (a sharded checkpoint); nothing when it does not exist."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
