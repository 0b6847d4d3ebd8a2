"""Scoring a batch of completions in parallel worker processes, with a per-item deadline enforced from outside.

    reward = get_reward("math", timeout=5.0, wrong=-1.0)        # or just the name "math" for the defaults
    with RewardPool(reward, num_workers=8, timeout=10.0) as pool:
        result = pool.score(completions, references)     # BatchResult
    result.scores                  # list[float], in input order
    result.correct                 # list[bool]: each outcome's `correct`, False for a timeout or an error
    result.timeouts, result.errors # counts to log, e.g. `self.log_dict(result.metrics())`

or, for a one-off batch, ``batch_rewards("code", completions, tests, num_workers=8, timeout=60.0)``.
`score_batch` is the one entry point for callers that may or may not want workers: with ``num_workers > 0``
it is `batch_rewards`; with 0 it scores in this process (`Reward.score_batch`). Both score through
`Reward.evaluate_batch` (a plain function is wrapped by `as_reward`; the code reward runs its threads there) and
settle every outcome the same way (`klear.rewards.base.settle`), so an exception, a NaN or a non-number gives the
same score, status and count either way.
The pool's ``timeout`` is wall-clock time, and the built-in rewards count their own limits in CPU time, which a busy
machine stretches on the wall clock; each also has a wall-clock bound of its own (`Reward.wall_limit`: math, per
acceptable answer, the checker's start-up and 10 times its ``timeout``; code, 10 times the completion's
``total_timeout`` and the sandbox's start-up). The pool waits for an item at least that bound plus
`OWN_LIMIT_MARGIN`, so the reward's own limits, not the machine's load, decide its verdict and the worker
survives; ``timeout`` is the deadline of a reward without such a bound (a plain function) and can only lengthen
the wait.

Each worker is a process that builds the reward once and then scores one item at a time. The parent sends the
next item to an idle worker and watches the clock: a worker that has not answered `item_timeout` seconds after it
received its item is SIGKILLed, replaced by a fresh one, and its item gets ``failure_reward`` and is counted in
``timeouts``. A worker that dies, or a reward that raises, gives ``failure_reward`` counted in ``errors``; a
reward's own ``"timeout"`` / ``"error"`` status (a math check that ran out of time, a sandbox that broke) is
counted the same way, keeping the reward's score. Nothing is scored as failed without being counted, and nothing
that timed out or failed is correct.

Workers are started with ``spawn`` (safe whatever threads the trainer runs), so a reward given as a callable
must be picklable (a `Reward` instance or a module-level function) and scripts need the usual
``if __name__ == "__main__":`` guard. `score` is safe to call from any thread (calls are serialised), and `close`
from another thread ends a `score` in progress at once, which then raises (a command stopped while a thread scores
for it, `klear.rollout.background_scoring`, does not wait for the batch). Workers
are daemonic: a reward function used here must not start ``multiprocessing`` children itself (the built-in
rewards start their helpers with ``subprocess``, which is allowed).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from klear.rewards.base import BatchResult, Reward, RewardFn, Settled, as_reward, settle
from klear.runtime.terminal import leave_stops_to_parent, starting_worker

_STARTUP_TIMEOUT = 120.0  # importing torch/sympy in a fresh process on a loaded machine
OWN_LIMIT_MARGIN = 10.0
"""Seconds past a reward's own wall-clock bound before the pool kills its worker: the worker's work around the
reward's limits (extracting the answer, parsing the tests, sending the outcome) on a loaded machine."""
_MAX_STARTUP_DEATHS = 3  # consecutive workers killed while starting before the pool gives up


class RewardPool:
    """``num_workers`` processes scoring with ``reward``, each item within ``timeout`` seconds.

    Args:
        reward: a registered name or import path (built with its default options), a `Reward` such as
            ``get_reward("math", wrong=-1.0)``, or a picklable function ``fn(completion, reference) -> float``.
        num_workers: worker processes.
        timeout: seconds one item may take once its worker has it; a reward's own longer wall-clock bound
            (`Reward.wall_limit`) extends it for its items (`item_timeout`).
        failure_reward: score of an item that timed out or failed.
    """

    def __init__(
        self,
        reward: str | RewardFn,
        num_workers: int = 4,
        timeout: float = 30.0,
        failure_reward: float = 0.0,
    ) -> None:
        if num_workers < 1 or timeout <= 0:
            raise ValueError(f"need num_workers >= 1 and timeout > 0, got {num_workers}, {timeout}")
        self._spec = as_reward(reward)  # a bad name fails here, once
        self.timeout = timeout
        self.failure_reward = failure_reward
        self._context = multiprocessing.get_context("spawn")
        self._startup_deaths = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._wake, self._waker = multiprocessing.Pipe(duplex=False)  # `close` wakes a `score` waiting on workers
        self._workers = [self._new_worker() for _ in range(num_workers)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        try:
            self._wait_all_ready()
        except BaseException:
            self._finalizer()
            raise

    def score(self, completions: Sequence[str], references: Sequence[Any]) -> BatchResult:
        """Score every ``(completion, reference)`` pair; never raises because of model output."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("this RewardPool is closed")
            return self._score(list(completions), list(references))

    def _score(self, completions: list[str], references: list[Any]) -> BatchResult:
        settled: list[Settled] = [("error", self.failure_reward, False, "")] * len(completions)
        pending = deque(range(len(completions)))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item, deadline)
        while pending or busy:
            for slot, worker in enumerate(self._workers):
                if pending and worker.ready and slot not in busy:
                    item = pending.popleft()
                    try:
                        worker.connection.send((item, completions[item], references[item]))
                    except OSError:  # it died while idle (OOM killer, ...): not the item's fault, retry it
                        pending.appendleft(item)
                        self._replace(slot)
                        continue
                    busy[slot] = (item, time.monotonic() + self.item_timeout(references[item]))
            self._wait([deadline for _, deadline in busy.values()], busy)
            for slot, worker in enumerate(self._workers):
                if slot not in busy:
                    continue
                item, deadline = busy[slot]
                if worker.connection.poll(0):
                    try:
                        _, *answer = worker.connection.recv()
                        settled[item] = tuple(answer)
                    except (EOFError, OSError):  # the worker died: segfault, OOM kill, os._exit in the reward
                        settled[item] = ("error", self.failure_reward, False, "")
                        self._replace(slot)
                elif time.monotonic() >= deadline:
                    settled[item] = ("timeout", self.failure_reward, False, "")
                    self._replace(slot)
                else:
                    continue
                del busy[slot]
        return BatchResult.of(settled)

    def item_timeout(self, reference: Any) -> float:
        """The seconds an item of ``reference`` may take: ``timeout``, or the reward's own wall-clock bound
        (`Reward.wall_limit`) and `OWN_LIMIT_MARGIN` when that is longer."""
        try:
            own = self._spec.wall_limit(reference)
        except Exception:  # a user's reward that cannot say: the pool's deadline alone
            own = None
        return self.timeout if own is None else max(self.timeout, own + OWN_LIMIT_MARGIN)

    def _wait(self, deadlines: list[float], busy: dict[int, Any]) -> None:
        """Block until a busy worker answers, a deadline passes, or a starting worker is ready."""
        starting = [slot for slot, worker in enumerate(self._workers) if not worker.ready]
        deadlines = deadlines + [self._workers[slot].started + _STARTUP_TIMEOUT for slot in starting]
        watched = [worker.connection for slot, worker in enumerate(self._workers) if slot in busy or not worker.ready]
        wait([*watched, self._wake], max(0.0, min(deadlines) - time.monotonic()))
        if self._closing.is_set():
            raise RuntimeError("this RewardPool was closed while it scored")
        for slot in starting:
            if self._workers[slot].check_started():
                self._startup_deaths = 0
            elif not self._workers[slot].process.is_alive():  # killed while starting (OOM killer): try again
                self._startup_deaths += 1
                if self._startup_deaths > _MAX_STARTUP_DEATHS:
                    raise RuntimeError(
                        f"reward workers keep dying while starting (exit {self._workers[slot].process.exitcode})"
                    )
                self._replace(slot)

    def _wait_all_ready(self) -> None:
        while any(not worker.ready for worker in self._workers):
            self._wait([], {})

    def _replace(self, slot: int) -> None:
        """Kill the worker in ``slot`` and start another; it joins in once it says it is ready."""
        self._workers[slot].kill()
        self._workers[slot] = self._new_worker()

    def _new_worker(self) -> _Worker:
        return _Worker(self._context, self._spec, self.failure_reward)

    def close(self) -> None:
        """Stop the workers; a `score` running on another thread raises at once instead of finishing its batch."""
        self._closing.set()
        with contextlib.suppress(OSError):
            self._waker.send_bytes(b"")
        with self._lock:
            self._finalizer()
            self._wake.close()
            self._waker.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def batch_rewards(
    reward: str | RewardFn,
    completions: Sequence[str],
    references: Sequence[Any],
    num_workers: int = 4,
    timeout: float = 30.0,
    failure_reward: float = 0.0,
) -> BatchResult:
    """Score one batch with a temporary `RewardPool` (start-up costs ~1 s: keep a pool for repeated batches)."""
    with RewardPool(reward, num_workers, timeout, failure_reward) as pool:
        return pool.score(completions, references)


def score_batch(
    reward: str | RewardFn,
    completions: Sequence[Any],
    references: Sequence[Any],
    num_workers: int = 0,
    timeout: float = 30.0,
    failure_reward: float = 0.0,
) -> BatchResult:
    """Score one batch, in ``num_workers`` worker processes (`batch_rewards`) or, with 0, in this process.

    ``reward`` is a name, a `Reward` or a plain function (`as_reward`). In this process it scores through
    `Reward.evaluate_batch` (the code reward on its ``workers`` threads), as a pool worker does, so the result is
    the same either way: a reward that raises, or returns NaN, inf or a non-number, gives ``failure_reward`` with
    status ``"error"`` and never propagates; a reward's own ``"timeout"`` / ``"error"`` keeps its score and is
    counted; ``correct`` is the outcome's, and False for every timeout and error.

    ``timeout`` is the pool's per-item deadline and applies only with ``num_workers > 0``: this process cannot
    kill a call that hangs, so in-process scoring relies on the reward's own limits (the built-in rewards
    return within their timeouts; a plain function is not interrupted).
    """
    if len(completions) != len(references):
        raise ValueError(f"{len(completions)} completions but {len(references)} references")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0 (0: score in this process), got {num_workers}")
    if num_workers:
        return batch_rewards(reward, completions, references, num_workers, timeout, failure_reward)
    return as_reward(reward).score_batch(completions, references, failure_reward)


class _Worker:
    def __init__(self, context: Any, reward: Reward, failure_reward: float) -> None:
        self.connection, child_end = context.Pipe()
        arguments = (child_end, reward, failure_reward)
        self.process = context.Process(target=_work, args=arguments, daemon=True, name="klear-reward")
        with starting_worker():
            self.process.start()
        child_end.close()  # so that the worker's death reads as EOF here
        self.started = time.monotonic()
        self.ready = False

    def check_started(self) -> bool:
        """True once the worker says it is ready; False while starting or after it died without a word (the
        caller decides); raises when the reward failed to build or the start takes too long."""
        if self.connection.poll(0):
            try:
                message = self.connection.recv()
            except EOFError:
                self.process.join()
                return False
            if message != "ready":
                raise RuntimeError(f"a reward worker failed to start: {message}")
            self.ready = True
        elif time.monotonic() > self.started + _STARTUP_TIMEOUT:
            self.kill()
            raise RuntimeError(f"a reward worker did not start within {_STARTUP_TIMEOUT:g}s")
        return self.ready

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(OSError):
            worker.connection.send(None)
    for worker in workers:
        worker.process.join(timeout=2.0)
        if worker.process.is_alive():
            worker.kill()
        else:
            worker.connection.close()


def _work(connection: Connection, reward: Reward, failure_reward: float) -> None:
    """Worker loop: warm the reward up, say "ready", then score items until told to stop (None), or until the parent
    is gone, quietly."""
    leave_stops_to_parent()  # the trainer's or the command's to act on: it closes the pool
    try:
        reward.warmup()
    except Exception as error:
        connection.send(f"{type(error).__name__}: {error}")
        return
    connection.send("ready")
    try:
        while (message := connection.recv()) is not None:
            item, completion, reference = message
            # As `score_batch` in the parent: `evaluate_batch` turns an exception into an "error" outcome.
            (outcome,) = reward.evaluate_batch([completion], [reference], failure_reward=failure_reward)
            connection.send((item, *settle(outcome, failure_reward)))
    except (EOFError, BrokenPipeError):  # the parent is gone (a run that ended at once): nothing left to score
        return
