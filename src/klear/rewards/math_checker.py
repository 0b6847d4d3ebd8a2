"""Client side of the math checker: hands an equivalence check to a `math_server` process, with a deadline.

Each calling thread borrows a checker process from a small per-process pool, so the check works the same from
the main thread, any other thread, a daemonic ``multiprocessing`` worker (the checkers are started with
``subprocess``, not ``multiprocessing``, so daemonic workers may start them) or a `RewardPool` worker. The
server enforces the check's timeout itself (CPU time, with a wall-clock backstop of `WALL_FACTOR` times it:
`klear.rewards.math_server`); this side waits at most that backstop plus ``REPLY_MARGIN`` for the reply and
kills the whole server if it does not answer, so a wedged server cannot hold a caller either. A killed server is
simply not returned to the pool.

Starting a server imports sympy and math-verify (~0.5-1 s, once per process); that start has its own limit,
``startup_timeout``, and `warmup` lets a caller pay it up front. The check timeout covers the check only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from klear.rewards.sandbox import WALL_FACTOR

logger = logging.getLogger(__name__)

REPLY_MARGIN = 1.0  # seconds past the check's wall-clock backstop before the server itself is presumed wedged
_MAX_IDLE = max(8, 2 * (os.cpu_count() or 1))  # idle servers kept for reuse (~100 MB each)


@dataclass(frozen=True)
class CheckResult:
    status: Literal["ok", "timeout", "error"]
    equal: bool
    detail: str = ""


class _Server:
    """One `math_server` process, used by one caller at a time."""

    def __init__(self, startup_timeout: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "klear.rewards.math_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # math-verify warns on every process start; replies carry the errors
            start_new_session=True,  # its own process group: killing it never signals ours
        )
        self._buffer = b""
        line = self._read_line(time.monotonic() + startup_timeout)
        if line != b'{"ready": true}':
            self.kill()
            raise TimeoutError(f"the math checker did not start within {startup_timeout:g}s")

    def request(self, payload: dict[str, object], deadline: float) -> bytes | None:
        """Send one request; the reply line, or None when none came by ``deadline``."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(payload).encode() + b"\n")
        self.process.stdin.flush()
        return self._read_line(deadline)

    def _read_line(self, deadline: float) -> bytes | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError(f"the math checker exited with code {self.process.wait()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._close_pipes()

    def close(self) -> None:
        """Ask the server to exit (its stdin closes); kill it if it does not within a second."""
        self._close_pipes()
        try:
            self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


_idle: list[_Server] = []
_lock = threading.Lock()


def check_equivalent(gold: str, pred: str, timeout: float, memory_mb: int, startup_timeout: float) -> CheckResult:
    """Whether ``pred`` is mathematically equal to ``gold`` according to math-verify, within ``timeout`` seconds
    of CPU time."""
    try:
        server = _acquire(startup_timeout)
    except (OSError, TimeoutError, EOFError, ValueError) as error:
        logger.warning("could not start the math checker process: %s", error)
        return CheckResult("error", False, f"checker did not start: {error}")
    payload = {"gold": gold, "pred": pred, "timeout": timeout, "memory_bytes": memory_mb * 2**20}
    wait = reply_wait(timeout)
    try:
        line = server.request(payload, time.monotonic() + wait)
    except (OSError, EOFError) as error:
        server.kill()
        return CheckResult("error", False, f"checker failed: {error}")
    if line is None:
        server.kill()
        return CheckResult("timeout", False, f"checker gave no answer within {wait:g}s")
    _release(server)
    reply = json.loads(line)
    return CheckResult(reply["status"], reply["equal"], reply["detail"])


def reply_wait(timeout: float) -> float:
    """How long a check of ``timeout`` CPU seconds is waited for: the server's own wall-clock backstop, and a
    margin."""
    return WALL_FACTOR * timeout + REPLY_MARGIN


def wall_limit(timeout: float, startup_timeout: float) -> float:
    """The most wall-clock seconds `check_equivalent` takes: a checker process started, then its reply waited for."""
    return startup_timeout + reply_wait(timeout)


def warmup(startup_timeout: float, count: int = 1) -> None:
    """Have ``count`` checker processes started and idle, so the first checks do not wait for sympy to import."""
    with _lock:
        missing = max(0, min(count, _MAX_IDLE) - len(_idle))
    with ThreadPoolExecutor(max(1, missing)) as executor:  # start them side by side
        servers = list(executor.map(lambda _: _Server(startup_timeout), range(missing)))
    for server in servers:
        _release(server)


def _acquire(startup_timeout: float) -> _Server:
    with _lock:
        if _idle:
            return _idle.pop()
    return _Server(startup_timeout)


def _release(server: _Server) -> None:
    with _lock:
        if len(_idle) < _MAX_IDLE:
            _idle.append(server)
            return
    server.close()


def _close_all() -> None:
    with _lock:
        servers = list(_idle)
        _idle.clear()
    for server in servers:
        server.close()


def _forget_inherited() -> None:
    # A forked child must not share its parent's servers (two processes writing to one pipe). Dropping the
    # references closes this process's copies of the pipes; the servers keep serving the parent.
    global _idle, _lock
    _idle = []
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited)
atexit.register(_close_all)
