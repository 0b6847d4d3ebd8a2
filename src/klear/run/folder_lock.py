"""One writer per output: the advisory lock a command holds on what it writes, for as long as it writes it.

Two commands writing the same output interleave their files (two ``klear.fit`` runs in one ``output_dir`` log every
step twice; an ``--overwrite`` during a run leaves its config beside the other run's checkpoints), so every command
that writes takes a `FolderLock` before it reads or writes anything there, and a second one is refused in one line
naming the holder: ``klear.fit`` and ``klear.compare`` on their ``output_dir`` (the lock file ``.klear.lock`` in it),
each ``klear.data`` command on each of its output files (``.<name>.klear.lock`` beside it).

The lock is ``fcntl.flock`` on the open lock file, which the kernel releases when the process ends however it ends
(``kill -9`` included); the file also holds the holder's record (command, pid, host, start time, one JSON line),
which is what the refusal names. A holder that ended without removing its file left a stale hold: the next command
takes it over and says so in one warning line. A hold whose lock is free but whose record names another host is
judged by its age, since a shared filesystem may not carry flock between hosts (NFS mounted with
``local_lock=flock``, some parallel filesystems): the holder refreshes the file's time every `REFRESH_S` seconds, and
a record from another host is stale once it has not been refreshed for `STALE_S` seconds (a lost node blocks the
folder that long). On a filesystem without locks at all (flock fails with ENOLCK or EOPNOTSUPP) the record alone
decides, by pid liveness on this host and by age from another one, with a warning that two commands started at the
same instant cannot be told apart there.

Only the job's first process takes the lock (`launching_process`): the ranks Lightning, torchrun or srun start
write through rank 0 and would otherwise find rank 0's lock held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from klear.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".klear.lock"
"""The lock file of a run's (or a comparison's) ``output_dir``."""
REFRESH_S = 30.0
"""How often a holder refreshes its lock file's time."""
STALE_S = 300.0
"""A record from another host not refreshed for this long is stale (a lost node)."""
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "PMI_RANK")
"""The variables by which launchers (Lightning's, torchrun, srun, jsrun, MPI) number the processes of a job."""
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}
"""flock's errors on a filesystem that does not lock."""

_held: set[int] = set()  # descriptors of the locks this process holds, closed in a forked child (`_forked`)


class FolderInUse(UserError):
    """An output another live command holds: one line naming it (pid, host, start) and what to do."""


def launching_process(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is the first of its job (rank 0, or a process no launcher numbered): the one that
    holds the job's outputs."""
    environ = os.environ if environ is None else environ
    return all(environ.get(key, "0") == "0" for key in RANK_VARIABLES)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock: its record."""

    command: str
    pid: int
    host: str
    started: str

    @classmethod
    def of_this_process(cls, command: str) -> Holder:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(command, os.getpid(), socket.gethostname(), started)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            record = json.loads(text)
            return cls(str(record["command"]), int(record["pid"]), str(record["host"]), str(record["started"]))
        except (ValueError, TypeError, KeyError):
            return None

    def __str__(self) -> str:
        return f"{self.command}, pid {self.pid} on host {self.host} since {self.started}"

    def alive(self) -> bool:
        """Whether the holder's process still exists (meaningful on its own host only)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it exists
            return True
        return True


class FolderLock:
    """The lock file ``path``, held by this process from `take` until `release`."""

    def __init__(self, path: Path, fd: int, created: list[Path]) -> None:
        self.path, self.fd, self.created = path, fd, created
        self._stop = threading.Event()
        self._refresh = threading.Thread(target=self._refresh_time, name="klear-lock-refresh", daemon=True)

    @classmethod
    def take(cls, path: Path, command: str, what: str, elsewhere: str) -> FolderLock:
        """Hold ``path`` (a lock file; missing folders above it are made, and removed again by ``release(undo)``)
        for ``command``, or raise `FolderInUse`: "``what`` is held by ...; wait for it to end, or ``elsewhere``"."""
        created, fd = _make_folders(path.parent), -1
        try:
            fd, stale, reason = _lock(path, what, elsewhere)
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(dataclasses.asdict(Holder.of_this_process(command))) + "\n").encode(), 0)
        except BaseException:
            if fd >= 0:  # locked, but its record could not be written (a full disk): not held
                path.unlink(missing_ok=True)
                os.close(fd)
            _remove_folders(created)
            raise
        if stale is not None:
            log.warning("%s: took over the stale hold of %s, %s", what, stale, reason)
        lock = cls(path, fd, created)
        _held.add(fd)
        lock._refresh.start()
        return lock

    def release(self, undo: bool = False) -> None:
        """Remove the lock file and let go of it; ``undo``: also remove the folders `take` made (when empty: a
        command refused before it wrote anything leaves none behind). Idempotent."""
        if self.fd < 0:
            return
        self._stop.set()
        if self._refresh.is_alive():
            self._refresh.join()  # before the descriptor it refreshes is closed
        self.path.unlink(missing_ok=True)  # before the unlock: a command waiting on this file then finds it gone
        _held.discard(self.fd)
        os.close(self.fd)
        self.fd = -1
        if undo:
            _remove_folders(self.created)

    def _refresh_time(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with contextlib.suppress(OSError):  # a missed refresh only makes the hold look older to another host
                os.utime(self.fd)


def _lock(path: Path, what: str, elsewhere: str) -> tuple[int, Holder | None, str]:
    """An open descriptor of ``path`` whose lock this process holds, the stale holder it replaces (or None) and
    why that one is stale."""
    while True:
        fd, locked = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), None
        try:
            locked = _flock(fd, path)
            if locked is not None and not _same_file(fd, path):  # its holder removed it on release: try again
                os.close(fd)
                continue
            record = Holder.parse(_read(fd))
            live = "" if locked is False else _live(record, path, locked)
            if live is not None:
                holder = record if record is not None else _wait_for_record(path)
                named = str(holder) if holder is not None else "another process"
                raise FolderInUse(
                    f"{what} is held by {named}{live} (lock file {path}): wait for it to end, or {elsewhere}"
                )
            return fd, record, _stale_reason(record, path)
        except FolderInUse:
            os.close(fd)
            raise
        except BaseException:  # a stop signal (or an error) while this process held the lock: not left behind
            if locked is True and _same_file(fd, path):
                path.unlink(missing_ok=True)
            os.close(fd)
            raise


def _flock(fd: int, path: Path) -> bool | None:
    """True: locked; False: another process holds it; None: this filesystem has no locks (warned about)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno not in NO_LOCKS:
            raise
        log.warning(
            "file locks are not supported where %s is (%s): its record alone keeps a second command out, and two "
            "started at the same instant cannot be told apart",
            path,
            error.strerror,
        )
        return None


def _live(record: Holder | None, path: Path, locked: bool | None) -> str | None:
    """How a record whose lock is free (``locked``; None: locks are not supported) still names a live holder: the
    text that says so in the refusal, or None when it is stale. On this host the lock itself is the answer."""
    if record is None:
        return None
    if record.host == socket.gethostname():
        return "; its process is alive" if locked is None and record.alive() else None
    age = _age(path)
    if age < STALE_S:
        return (
            f", refreshed {age:.0f} s ago (another host's hold is taken over after {STALE_S:.0f} s without a refresh)"
        )
    return None


def _stale_reason(record: Holder | None, path: Path) -> str:
    if record is None or record.host == socket.gethostname():
        return "which ended without releasing it"
    return f"which its host has not refreshed for {_age(path):.0f} s"


def _age(path: Path) -> float:
    return time.time() - path.stat().st_mtime


def _wait_for_record(path: Path, seconds: float = 2.0) -> Holder | None:
    """The holder's record, which it writes right after taking the lock: read until it is there."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            record = Holder.parse(path.read_text())
        except OSError:
            record = None
        if record is not None or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace")


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and the folders above it that are missing; the ones made, outermost first."""
    missing = [parent for parent in [folder, *folder.parents] if not parent.exists()][::-1]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_folders(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:  # something else was written there since: it stays
            return


def _forked() -> None:
    """In a forked child, close the inherited lock descriptors: a child that outlives its parent must not keep the
    parent's lock (closing a copy leaves the parent's lock held)."""
    for fd in list(_held):
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forked)
