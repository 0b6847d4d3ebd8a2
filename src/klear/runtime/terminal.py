"""The terminal a process runs in, and the signals that reach it through its process group.

SIGHUP is what a process receives when its terminal closes (an ssh connection that drops, a terminal window closed,
the shell that started it in the background exiting); from then on a write to the terminal fails with ``EIO``, and
a pipe the output went through (``klear.fit ... | tee run.log``) loses its reader, which the same hangup ends, so a
write there fails with ``EPIPE``. :func:`detach_terminal` points such standard streams at the null device instead,
so that a command that stops on SIGHUP (`klear.run.loading_stop`, `klear.run.stopping`) can finish its stop and
write its files. Ctrl-C, SIGTERM sent to a process group and SIGHUP also reach the worker processes a command
starts in its own group (the reward pool, the rollout worker): :func:`leave_stops_to_parent` leaves them to the
command, which stops its workers itself.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

HANGUP = getattr(signal, "SIGHUP", None)
"""SIGHUP; None where the platform has no such signal."""
READER_WAIT_S = 0.5
"""Seconds :func:`detach_terminal` waits for the reader of a pipe the output goes to to end (the hangup that reached
this process reaches a pipeline's reader too): a reader still there after that keeps the output."""


def detach_terminal() -> None:
    """Point standard input, output and error at the null device where they are a terminal that hung up (a character
    device that is no longer a terminal) or a pipe whose reader has ended (waiting `READER_WAIT_S` for it to end).
    A terminal still open, a file, and a pipe still read stay: a SIGHUP sent by hand leaves the command's lines where
    the user reads them."""
    deadline = time.monotonic() + READER_WAIT_S
    for fd in (0, 1, 2):
        try:
            mode = os.fstat(fd).st_mode
            dead_terminal = stat.S_ISCHR(mode) and not os.isatty(fd)
            if dead_terminal or (fd > 0 and stat.S_ISFIFO(mode) and _reader_ended(fd, deadline)):
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, fd)
                os.close(null)
        except OSError:  # fd closed: nothing to write to
            continue


def _reader_ended(fd: int, deadline: float) -> bool:
    """Whether the pipe ``fd`` writes to has no reader left, waiting for that until ``deadline``."""
    poller = select.poll()
    poller.register(fd, 0)  # no event asked: poll returns on POLLERR, which a pipe without readers reports
    milliseconds = max(0, round((deadline - time.monotonic()) * 1000))
    return any(events & select.POLLERR for _, events in poller.poll(milliseconds))


def detach_on_hangup(signum: int, frame) -> None:
    """A SIGHUP handler that only takes the output off the closed terminal (:func:`detach_terminal`)."""
    detach_terminal()


STOPS = frozenset(
    stop for stop in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None), HANGUP) if stop is not None
)
"""The signals that stop a command, which its workers leave to it (:func:`leave_stops_to_parent`)."""
MASKS = hasattr(signal, "pthread_sigmask")
"""Whether this platform has signal masks (POSIX); without them a worker ignores the stops from its first line on."""


@contextmanager
def starting_worker() -> Iterator[None]:
    """Around the start of a worker process that calls :func:`leave_stops_to_parent`: the stops are blocked in this
    thread, so the worker starts with them blocked (a child inherits its parent's signal mask and keeps it across
    ``exec``) and a Ctrl-C to the process group while it imports (seconds) does not end it in a traceback. A stop
    that comes meanwhile reaches this process as soon as the start is done. multiprocessing's resource tracker is
    started first: a process's first spawn starts it, and starting it unblocks SIGINT and SIGTERM in this thread,
    which would let the worker start with them unblocked."""
    if not MASKS:
        yield
        return
    from multiprocessing import resource_tracker  # only where workers start

    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        with _stops_held():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def _stops_held() -> Iterator[None]:
    """In the main thread, a stop's Python handler waits for the block's end, then runs as it would have. Blocking a
    signal in this thread is not enough where the process has other threads (a library's thread pool): the kernel
    gives a signal sent to the process to a thread that does not block it, and Python then runs the handler in the
    main thread, here, between a worker's spawn and the data sent to it (the worker then ends in a traceback)."""
    received: list[int] = []
    try:
        with handled(STOPS, lambda signum, frame: received.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)  # blocked in this thread until the caller's mask is restored


@contextmanager
def handled(signals: Iterable[int], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for each of ``signals`` within this context, the previous handlers after it; in the main thread,
    the one Python runs handlers in (elsewhere: nothing). A signal whose handler Python did not set (None, which
    could not be restored) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signals if signal.getsignal(signum) is not None}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def leave_stops_to_parent() -> None:
    """In a worker process (the reward pool's, the rollout worker): Ctrl-C, SIGTERM, SIGUSR1 and SIGHUP reach it with
    its parent (one process group, or every process of a SLURM job step) and are the parent's to act on, which then
    stops the worker; a hangup only detaches the worker's output from the closed terminal (:func:`detach_terminal`).
    The worker started with them blocked (:func:`starting_worker`): they are unblocked once so set."""
    for stop in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)):
        if stop is not None:
            signal.signal(stop, signal.SIG_IGN)
    if HANGUP is not None:
        signal.signal(HANGUP, detach_on_hangup)
    if MASKS:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
