"""What a data command reads and writes, checked before it reads a row: no output may be one of its inputs, and
every output must be writable where it is asked for; and while a command writes an output, no other command may
(`hold_outputs`).

A command that writes over its own input loses data and still exits 0 (``dedup --data t.jsonl --out t.jsonl``
leaves the deduplicated rows in place of the originals, and a rerun removes more), so every ``klear.data``
command declares its files (`Files`) and `check_files` refuses, in one line naming both options, an output that
is the same file as an input: the same path, another spelling of it, a symbolic link to it or a hard link
(``os.path.samefile`` compares the device and inode). An output whose folder is a file, or a folder that cannot
be written, is refused the same way, before anything is read or computed, instead of a traceback at the end; so is
an output that exists and is no regular file (a device such as ``/dev/full``, a FIFO, a socket, or a symbolic link
to one): the atomic write renames a new file over the output, which would replace the device itself (as root) and
report success. A symbolic link to a regular file is written like any output: the link is replaced by the new
file, and the file it pointed to is left as it was.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from klear.prep.rowfiles import CommandError, special_file
from klear.run.directory import folder_problem
from klear.run.folder_lock import FolderLock


@dataclass(frozen=True)
class Files:
    """A command's files, each with what names it (``--data``, ``--out``, "the report of --out", ...)."""

    inputs: Sequence[tuple[str, str | Path]] = field(default_factory=list)
    outputs: Sequence[tuple[str, str | Path]] = field(default_factory=list)


def check_files(files: Files) -> None:
    """Raise `CommandError` when an output cannot be written or is the same file as an input."""
    for label, out in files.outputs:
        out = Path(out)
        check_writable(label, out)
        for source, path in files.inputs:
            if same_file(out, Path(path)):
                option = next(word for word in label.split() if word.startswith("--"))  # "the report of --out"
                raise CommandError(
                    f"{label} {out} is the {source} file {path}: writing it would replace that input; "
                    f"pick another {option}"
                )


def same_file(out: Path, path: Path) -> bool:
    """Whether writing ``out`` would write ``path``'s file (through any spelling, symbolic or hard link).

    An output that does not exist yet is a new file; an input that is not a file (a hub dataset name, a datasets
    folder) is never written by a command.
    """
    target = Path(os.path.realpath(out))  # links followed, and ``sub/..`` undone as the write's mkdir would
    if not (target.exists() and path.is_file()):
        return False
    return os.path.samefile(target, path)  # device and inode: hard links too


def check_writable(label: str, out: Path) -> None:
    """``out`` can be created or replaced: not a folder itself, under folders (existing or to be made) only, the
    nearest existing one writable."""
    if out.is_dir():
        raise CommandError(f"{label} {out} is a folder: give the path of a file to write")
    kind = special_file(out)
    if kind is not None:
        link = "a symbolic link to " if out.is_symlink() else ""
        raise CommandError(
            f"{label} {out} is {link}{kind}, not a regular file: writing it would replace it; "
            "give the path of a file to write"
        )
    problem = folder_problem(out.parent)  # made by the write (mkdir -p) where missing
    if problem is not None:
        raise CommandError(f"{label} {out}: {problem}; write {label} elsewhere")


def hold_outputs(files: Files, command: str) -> list[FolderLock]:
    """Hold each output of ``command`` (`klear.run.folder_lock`: the lock file ``.<name>.klear.lock`` beside it), or
    raise `klear.run.folder_lock.FolderInUse` naming the live command that writes it, holding nothing."""
    locks: list[FolderLock] = []
    try:
        for label, out in files.outputs:
            out = Path(out)
            option = next(word for word in label.split() if word.startswith("--"))
            lock = out.parent / f".{out.name}.klear.lock"
            locks.append(FolderLock.take(lock, command, f"{label} {out}", f"write {option} elsewhere"))
    except BaseException:
        release(locks)
        raise
    return locks


def release(locks: list[FolderLock]) -> None:
    """Let go of ``locks``, removing the folders they made that nothing was written into."""
    for lock in reversed(locks):
        lock.release(undo=True)
