"""The math-equivalence checker process: ``python -m klear.rewards.math_server``.

Why a separate process: math-verify's own timeout is ``signal.alarm``, which only works in the main thread of
the main interpreter (verl scored every answer 0 from worker threads; TRL crashed), and sympy can run for hours
on ``9^{9^{9^9}}`` inside one C-level bignum operation that no Python-level timeout can interrupt. So the
timeouts of math-verify are switched off here and the checks run in a child forked from this process (which
has sympy and math-verify imported and warmed up), under an address-space limit. The child keeps its caches
from check to check; a check that runs out of time ends it, and the next check forks a fresh one (~2 ms). This
process only forks, relays and waits, so it stays responsive.

Time is CPU time, as in the code sandbox, so a busy machine never turns a check that finishes into a timeout (a
check's verdict, and with it a seeded run, does not depend on the load): before each check the child arms a
CPU-time timer (``ITIMER_PROF``, user + system) of ``timeout`` seconds, whose signal ends it even inside one long
bignum operation. A check that gets no CPU at all is stopped by a wall-clock backstop of
`klear.rewards.sandbox.WALL_FACTOR` times ``timeout``.

Protocol: one JSON object per line. This process first writes ``{"ready": true}``; then for each request
``{"gold": str, "pred": str, "timeout": float, "memory_bytes": int}`` it answers
``{"status": "ok" | "timeout" | "error", "equal": bool, "detail": str}``. It exits when stdin closes, which
is also what happens when its parent dies.

Only LaTeX extraction is used: math-verify's plain-expression extractor hands text to sympy's ``parse_expr``,
which calls ``eval``; never on model output. Both answers arrive already cut out of the completion and are
wrapped in ``\\boxed{}`` so math-verify parses exactly that text.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

from klear.rewards.sandbox import WALL_FACTOR


def check(gold: str, pred: str) -> bool:
    """math-verify's verdict on whether ``pred`` equals ``gold`` (no timeouts: the caller enforces them)."""
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    gold_parsed = parse(f"\\boxed{{{gold}}}", extraction_config=config, parsing_timeout=None)
    pred_parsed = parse(f"\\boxed{{{pred}}}", extraction_config=config, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


class CheckProcess:
    """A child forked from this (warm) process that runs checks one after another, keeping sympy's and
    math-verify's caches between them (a repeated reference costs ~1 ms instead of ~50), under an address-space
    limit. A check past its CPU time ends it (``SIGPROF``), one past the wall-clock backstop is SIGKILLed, and the
    next check forks a fresh one, which costs ~2 ms."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        request_r, self.request_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.request_w)
            os.close(self.reply_r)
            _serve(request_r, reply_w, memory_bytes)
        os.close(request_r)
        os.close(reply_w)
        self.buffer = b""

    def check(self, gold: str, pred: str, timeout: float) -> dict[str, Any] | None:
        """The reply, or None when the check ran out of CPU time (the process ended itself) or past the wall-clock
        backstop, or the process died: it is then dead for good (`kill` reaps it)."""
        _write_all(self.request_w, json.dumps([gold, pred, timeout]).encode() + b"\n")
        deadline = time.monotonic() + WALL_FACTOR * timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.reply_r], [], [], remaining)[0]:
                return None
            chunk = os.read(self.reply_r, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> int:
        """End the process (if it has not ended itself) and reap it; its wait status."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        status = os.waitpid(self.pid, 0)[1]
        os.close(self.request_w)
        os.close(self.reply_r)
        return status


def _serve(request_r: int, reply_w: int, memory_bytes: int) -> None:
    """The check process: answer ``[gold, pred]`` lines until the pipe closes. Never returns."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # let go of the client's pipes: only the server talks to it
        os.dup2(null, 1)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        signal.signal(signal.SIGPROF, signal.SIG_DFL)  # its default action ends the process
        with os.fdopen(request_r, "rb") as requests:
            for line in requests:
                gold, pred, timeout = json.loads(line)
                signal.setitimer(signal.ITIMER_PROF, timeout)
                try:
                    reply = {"status": "ok", "equal": check(gold, pred), "detail": ""}
                except BaseException as error:  # a MemoryError or RecursionError from sympy: the answer's fault
                    reply = {"status": "error", "equal": False, "detail": f"{type(error).__name__}: {error}"[:300]}
                signal.setitimer(signal.ITIMER_PROF, 0)
                _write_all(reply_w, json.dumps(reply).encode() + b"\n")
    finally:
        os._exit(0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    check("\\frac{1}{2}", "0.5")  # import and warm the parsers once, so every forked check starts warm
    check("\\{1,2\\}", "(1, 2]")
    out = sys.stdout.buffer
    out.write(json.dumps({"ready": True}).encode() + b"\n")
    out.flush()
    process: CheckProcess | None = None
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if process is not None and process.memory_bytes != request["memory_bytes"]:
            process.kill()
            process = None
        process = process or CheckProcess(request["memory_bytes"])
        timeout = request["timeout"]
        reply = process.check(request["gold"], request["pred"], timeout)
        if reply is None:
            ended = process.kill()
            process = None
            if os.WIFSIGNALED(ended) and os.WTERMSIG(ended) == signal.SIGPROF:
                detail = f"check used more than {timeout:g}s of CPU time"
            else:
                detail = f"check took more than {WALL_FACTOR * timeout:g}s"
            reply = {"status": "timeout", "equal": False, "detail": detail}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
