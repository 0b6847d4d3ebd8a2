"""Stopping a run before its fit: SIGTERM, SIGHUP or Ctrl-C while the config, the data or the model load.

Until the Trainer's fit starts no rank runs a collective, so each one can stop by itself, at once, wherever it is:
:func:`stop_signals_raise` makes SIGTERM and SIGHUP raise :class:`Terminated` in the main thread, as Ctrl-C raises
``KeyboardInterrupt``. The command then prints one line, exits with :data:`EXIT_SIGTERM` (143), 129 (SIGHUP) or
:data:`EXIT_INTERRUPTED` (130), and leaves ``output_dir`` as it found it: :class:`OutputState` remembers, before
anything is written, whether the folder existed and what the files a start writes held (``config.yaml``,
``data_report.json``), and puts that back: a folder the start created is removed, an existing run's files get
their bytes back, and a write cut short leaves nothing behind. From the fit on, `klear.run.stopping` stops the
ranks together instead.

The other commands (``klear.eval``, ``klear.compare``, ``klear.data``) hold no collective at all: they stop this way
for their whole run, with :func:`stop_outcome` for their one line and exit status.

SIGHUP, which a command receives when its terminal closes, stops it as SIGTERM does, once its output is taken off
the closed terminal (`klear.runtime.terminal`). A command started under ``nohup`` (SIGHUP ignored) keeps ignoring
it (:func:`stop_signals`).

This module imports nothing heavy: a SIGTERM may come before torch is imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from klear.runtime.terminal import HANGUP, detach_terminal, handled

EXIT_SIGTERM = 128 + signal.SIGTERM
"""The exit status of a run stopped by SIGTERM (143: what a shell reports for a process ended by SIGTERM)."""
EXIT_INTERRUPTED = 128 + signal.SIGINT
"""The exit status of a run interrupted with Ctrl-C (130)."""
WRITTEN = ("config.yaml", "data_report.json")
"""The files of ``output_dir`` that a start writes before the fit (`klear.run.directory.RunDir`)."""


class Terminated(BaseException):
    """SIGTERM, SIGHUP or SIGUSR1 (its name is the message: ``Terminated("SIGHUP")``). A ``BaseException``, as
    ``KeyboardInterrupt``: no ``except Exception`` of the code it interrupts keeps it from stopping the run."""


def _raise(signum: int, frame) -> None:
    if signum == HANGUP:
        detach_terminal()
    raise Terminated(signal.Signals(signum).name)


def stop_outcome(stop: BaseException) -> tuple[int, str, str]:
    """What a stop (:class:`Terminated` or ``KeyboardInterrupt``) makes of a command: its exit status, the word for
    what happened and its cause: ``(143, "stopped", "SIGTERM")``, ``(129, "stopped", "SIGHUP")`` or
    ``(130, "interrupted", "Ctrl-C")``."""
    return signal_outcome(signal.Signals[str(stop)] if isinstance(stop, Terminated) else signal.SIGINT)


def signal_outcome(signum: int) -> tuple[int, str, str]:
    """:func:`stop_outcome` of a stop by the signal ``signum`` (SIGINT: Ctrl-C)."""
    if signum == signal.SIGINT:
        return EXIT_INTERRUPTED, "interrupted", "Ctrl-C"
    return 128 + signum, "stopped", signal.Signals(signum).name


def stop_signals() -> list[signal.Signals]:
    """The signals that stop a command as SIGTERM does: SIGTERM; SIGHUP (a closed terminal) and SIGUSR1 (what SLURM
    sends ahead of a time limit with ``--signal=USR1@N``, Lightning's usual advice, whose default action would end
    the run at once), each unless the process ignores it now (SIGHUP under ``nohup``: the user asked the command to
    outlive its terminal). Read before a handler is installed."""
    others = [HANGUP, getattr(signal, "SIGUSR1", None)]
    return [signal.SIGTERM, *(s for s in others if s is not None and signal.getsignal(s) is not signal.SIG_IGN)]


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGUSR1 (:func:`stop_signals`) raise :class:`Terminated` in the main thread within this
    context; the previous handlers after it. Outside the main thread (a command's ``main`` called from another
    thread), which no signal reaches, nothing."""
    with handled(stop_signals(), _raise):
        yield


class OutputState:
    """What ``root`` (a run's ``output_dir``) held before a start wrote to it, to put back (see the module
    docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.existed = self.root.is_dir()
        self.files: dict[str, bytes | None] = {}
        """Each file's bytes, or None where it did not exist; one this process cannot read is left alone."""
        for name in WRITTEN:
            with contextlib.suppress(OSError):  # output_dir cannot be read: the start refuses it in one line
                self.files[name] = _read(self.root / name)

    def restore(self) -> str:
        """Put back what :meth:`__init__` saw; returns what became of ``root``, for the run's one line."""
        if not self.root.is_dir():  # never made, or made and removed again by the folder lock's undo
            return f"{self.root} did not exist before and does not now"
        pid = os.getpid()
        for leftover in [*self.root.glob(f".*.{pid}.tmp"), *self.root.glob(f".klear-write-probe-{pid}")]:
            leftover.unlink(missing_ok=True)  # a write that was cut short
        for name, content in self.files.items():
            put_back(self.root / name, content)
        if self.existed:
            return f"{self.root} is as it was"
        if not any(self.root.iterdir()):
            self.root.rmdir()
            return f"{self.root}, which it had created, was removed"
        return f"{self.root} holds only what others wrote there"


def put_back(path: Path, content: bytes | None) -> None:
    """``path`` as it was (``content``; None: absent), touched only when it changed, replaced whole."""
    if _read(path) == content:
        return
    if content is None:
        path.unlink(missing_ok=True)
    else:
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(content)
        os.replace(temporary, path)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
