"""A rank that fails stops every rank within seconds, and rank 0 says which rank failed and why.

A rank of a multi-process run can fail alone: an exception in its share of a step (a reward or objective of the
user's that raises on one row, a CUDA out-of-memory on one device), or the kernel's out-of-memory killer ending it.
The other ranks learn of it only through their next collective: with gloo an error that names a closed connection,
with NCCL nothing at all until the process group's timeout (30 minutes), the job holding its GPUs meanwhile. Rank 0
then reported its own error (``Connection closed by peer``) as the run's, and the failing rank's traceback was one
among N.

Here instead every rank writes its failure, when it has one, to the process group's own key-value store (the
c10d store every rank already reaches) from Lightning's ``on_exception`` hook, before its own teardown, and:

- a watcher thread on every rank polls the store (every :data:`POLL_S` seconds); once another rank has failed, or
  the store stopped answering (the rank that holds it is gone), this rank has :data:`GRACE_S` seconds to fail in
  its own collective (what gloo does at once) and end the run as usual, after which it exits regardless (what a
  rank blocked in an NCCL collective needs), rank 0 first writing the report and the summary;
- the run's status names the first failure of any rank, ``run failed at step N: RuntimeError on rank 1: ...``, and
  a rank that failed because another did prints no traceback of its own: the failing rank's is the one to read;
- the ranks that Lightning's launcher starts (``trainer.devices=N`` without ``torchrun``) are watched by rank 0
  (:func:`watch_started_ranks`): one that exits without a word (killed by the out-of-memory killer) is written to
  the store as such, where Lightning's own observer killed rank 0 with SIGKILL within 5 s, before any summary.

Failures every rank meets together (a stop, a run that diverged, a write failure the ranks agreed on) are the
callers' ``agreed`` types: they are not written, since every rank ends the run the same way already.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import lightning as L

from klear.errors import first_line

POLL_S = 0.5
"""Seconds between two looks at the store: how late a rank learns that another failed."""
GRACE_S = 20.0
"""Seconds a rank that learned of another rank's failure may take to fail in its own collective and end the run as
usual, before it exits regardless."""
PEER_WAIT_S = 4 * POLL_S
"""Seconds a rank whose own collective failed waits for the failure of the rank that caused it, when none is written
yet: a rank that died is written by the process that started it within one poll."""
COUNT_KEY = "klear/failures"
"""The store's counter of failures written; failure ``n`` (from 1) is under ``klear/failure/n``."""


@dataclass(frozen=True)
class Failure:
    """How one rank failed: the exception's type and first line; or ``kind`` ``""`` and a whole phrase that its own
    error line expands (an allocation that failed: `klear.run.out_of_memory`); or ``kind`` ``"exited"`` for a rank
    that ended without an exception. ``step``: the step it failed in."""

    rank: int
    kind: str
    message: str
    step: int = 0

    def describe(self) -> str:
        """The run's status detail: ``RuntimeError on rank 1: ...``, ``out of memory ... on rank 1``, or ``rank 1 was
        killed by SIGKILL ...``."""
        if self.died:
            return f"rank {self.rank} {self.message}"
        return (
            f"{self.message} on rank {self.rank}"
            if not self.kind
            else f"{self.kind} on rank {self.rank}: {self.message}"
        )

    def line(self) -> str:
        """Rank 0's one line for a run that another rank's failure ended."""
        if self.died:
            return f"rank {self.rank} {self.message}, so every rank stopped"
        if not self.kind:
            return (
                f"rank {self.rank} failed at step {self.step}: {self.message}; every rank stopped (rank {self.rank}'s "
                "own error line says what to change)"
            )
        return (
            f"rank {self.rank} failed at step {self.step}: {self.kind}: {self.message}; every rank stopped (the "
            f"traceback is in rank {self.rank}'s output, its lines prefixed [rank{self.rank}])"
        )

    @property
    def died(self) -> bool:
        """A rank that ended without an exception of its own (the out-of-memory killer): what made every other rank
        fail, whenever it was written."""
        return self.kind == "exited"


def exit_message(returncode: int) -> str:
    """What ended a process, from its exit status: ``was killed by SIGKILL ...`` for -9, ``exited with status 1``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the out-of-memory killer, or kill -9)" if returncode == -signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode}"


class RankFailures(L.Callback):
    """The module docstring's failure board for one fit: written from ``on_exception``, watched from ``setup`` (the
    process group exists there), open to the ranks this process starts from :meth:`open`, until :meth:`close`.

    Args:
        on_forced_exit: called once, from the watcher thread, before this rank exits on another rank's failure
            (rank 0 writes the report and prints the summary there), with that failure.
        describe: this rank's exception as the `Failure`'s ``kind`` and ``message`` (by default its type and first
            line).
        closing: the lock held by whoever ends the run (`klear.run.stopping.SignalStop.closing`): a forced exit
            only happens while the main thread has not begun to end the run itself.
        agreed: the exception types every rank raises together, which are not written.
    """

    def __init__(
        self,
        on_forced_exit: Callable[[Failure], None],
        closing: threading.Lock,
        agreed: tuple[type, ...] = (),
        describe: Callable[[BaseException], tuple[str, str]] | None = None,
    ) -> None:
        self.on_forced_exit = on_forced_exit
        self.describe = describe or (lambda error: (type(error).__name__, first_line(error)))
        self.closing = closing
        self.agreed = agreed
        self.rank = 0
        self.store = None
        """The process group's store, once a process group of more than one rank exists."""
        self.seen: Failure | None = None
        """The first failure read from the store, kept for when the store is gone."""
        self.done = threading.Event()
        self.deadline: float | None = None
        """When this rank exits regardless (``time.monotonic``), once another rank failed."""

    # ------------------------------------------------------------------ writing

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        if trainer.world_size < 2 or not dist.is_initialized() or self.store is not None:
            return
        self.rank, self.store = trainer.global_rank, dist.distributed_c10d._get_default_store()
        threading.Thread(target=self._watch, name="klear-rank-failures", daemon=True).start()

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Exception) or isinstance(exception, self.agreed) or self.settled():
            return  # a failure every rank meets, or one that another rank's caused (its store may be gone)
        step = trainer.fit_loop.epoch_loop.batch_progress.total.completed
        self.write(Failure(self.rank, *self.describe(exception), step))

    def write(self, failure: Failure) -> None:
        """Add ``failure`` to the store (nothing when there is no store, or it is gone)."""
        if self.store is None:
            return
        try:
            number = self.store.add(COUNT_KEY, 1)
            self.store.set(f"klear/failure/{number}", json.dumps(asdict(failure)))
        except Exception:  # the store's rank is gone: the others learn of it by its absence
            pass

    # ------------------------------------------------------------------ reading

    def first(self, wait_s: float = 0.0) -> Failure | None:
        """The failure that ended the run: a rank that died without a word (:attr:`Failure.died`), else the first
        failure written; None when none was (a single process, or no rank failed). ``wait_s``: how long to wait for
        one written by another rank (a rank whose own collective failed may be first to see it)."""
        end = time.monotonic() + wait_s
        while not self.settled():
            failures = self._read()
            if failures is None:  # the store's rank is gone, before it wrote why
                self.seen = Failure(0, "exited", "is gone (the process group's store stopped answering)")
            elif failures:
                dead = [failure for failure in failures if failure.died]
                self.seen = (dead or failures)[0]
            if self.settled() or time.monotonic() >= end:
                break
            time.sleep(POLL_S / 5)
        return self.seen

    def settled(self) -> bool:
        """Whether the failure that ended the run is known for good: another rank's, on a rank other than rank 0
        (which reports it, and holds the store under Lightning's launcher; the others stop reading a store that may
        be gone, where every read would print c10d's warning), or a rank that died."""
        seen = self.seen
        return seen is not None and seen.rank != self.rank and (self.rank != 0 or seen.died)

    def _read(self) -> list[Failure] | None:
        """Every failure written so far, in order; None when the store does not answer."""
        if self.store is None:
            return []
        try:
            count = self.store.add(COUNT_KEY, 0)
            keys = [f"klear/failure/{number}" for number in range(1, count + 1)]
            return [Failure(**json.loads(self.store.get(key))) for key in keys if self.store.check([key])]
        except Exception:
            return None

    # ------------------------------------------------------------------ watching

    def _watch(self) -> None:
        while not self.done.wait(POLL_S):
            failure = self.first()
            if failure is None or failure.rank == self.rank:
                continue
            if self.deadline is None:
                self.deadline = time.monotonic() + GRACE_S
            elif time.monotonic() >= self.deadline:
                self._force(failure)
                return

    def _force(self, failure: Failure) -> None:
        if self.done.is_set() or not self.closing.acquire(blocking=False):
            return  # the fit ended, or the main thread is ending the run itself
        try:
            self.on_forced_exit(failure)
        finally:
            os._exit(1)

    def open(self) -> None:
        """Take the reports of the ranks this process starts (`watch_started_ranks`), from now until :meth:`close`:
        call it right before ``fit``, and `close` after it, however it ended."""
        boards.append(self)

    def close(self) -> None:
        """Stop watching (the fit is over): a process that lives on is never ended by it."""
        self.done.set()
        if self in boards:
            boards.remove(self)

    def rank_exited(self, rank: int, returncode: int) -> None:
        """A rank this process started ended with ``returncode`` (`watch_started_ranks`): written to the store when it
        wrote no failure of its own; before the process group formed (no store yet, this rank waiting for that rank to
        join it), the run ends at once."""
        failure = Failure(rank, "exited", exit_message(returncode))
        if self.store is None:
            self._force(failure)
        elif all(written.rank != rank for written in self._read() or []):  # a store gone: this write fails too
            self.write(failure)


boards: list[RankFailures] = []
"""The boards of this process's fits in progress: where the ranks it started report."""


def watch_started_ranks(children: list[subprocess.Popen]) -> threading.Thread:
    """Watch the ranks Lightning's launcher started (``children``: local ranks 1, 2, ... of node ``NODE_RANK``, which
    the launcher sets) in place of Lightning's own observer (`klear.runtime.lightning_compat.observe_started_ranks`):
    one that ends with a non-zero status is reported to this process's fit (:meth:`RankFailures.rank_exited`). Unlike
    Lightning's observer, it kills no process: every rank exits on its own, rank 0 after its summary. Returns the
    watching thread, which ends once every child has."""
    first_rank = int(os.environ.get("NODE_RANK", "0")) * (len(children) + 1)

    def watch() -> None:
        running = dict(enumerate(children, start=1))
        while running:
            time.sleep(POLL_S)
            for local, child in list(running.items()):
                if child.poll() is None:
                    continue
                del running[local]
                for board in list(boards) if child.returncode != 0 else []:
                    board.rank_exited(first_rank + local, child.returncode)

    watcher = threading.Thread(target=watch, name="klear-started-ranks", daemon=True)
    watcher.start()
    return watcher
