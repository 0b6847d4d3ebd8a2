"""Scoring the prompts whose samples have ended while the engine samples the rest.

An engine that gives each prompt's samples as soon as they end (`klear.rollout.engine.StreamingEngine`: vLLM's)
leaves the scorer idle until the last answer, then the engine idle while the scorer checks every sample: on code,
whose tests run for seconds a sample, that wait adds up to a large share of a step. `BackgroundScoring` scores on a
thread instead, while the caller keeps taking answers from the engine:

    with BackgroundScoring(scorer.score) as scoring:
        for index, rollouts in engine.stream(prompts, sampling):
            scoring.add(index, rollouts, references[index])
        scored = scoring.wait()          # {index: ScoredRollouts}, every prompt's

The thread takes everything waiting each time it is free and scores it in one call, so the scorer gets batches as
large as the prompts that ended meanwhile (a pool's workers stay busy) and is never called twice at once. A sample's
score does not depend on what it is scored with, so the scores are those of one call on the whole set.

Only for a scorer whose work runs in other processes (`klear.rewards.RewardScorer.overlap`): the thread only
sends the samples and waits. A reward scored in this process may rely on the main thread (a timeout by
``signal.alarm``, as math-verify's own) and would compete with the engine's loop for the interpreter.

Leaving the ``with`` block by an exception (a stop, an engine's error) does not wait for the batch being scored:
the thread takes nothing more, and the scorer's owner closes it (`klear.rewards.RewardPool.close` ends a batch in
progress at once). An exception of the scorer is raised in the caller, at its next `add` or at `wait`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from klear.rewards.scorer import ScoredRollouts
from klear.rollout.engine import Rollout

Score = Callable[[Sequence[Rollout], list[Any]], ScoredRollouts]
"""``(rollouts, references) -> ScoredRollouts``: `klear.rewards.RewardScorer.score`, or verdicts alone
(`ScoredRollouts.of_verdicts`)."""


class BackgroundScoring:
    """Groups of samples scored on a thread as they are added (see the module docstring).

    Args:
        score: ``(rollouts, references) -> ScoredRollouts``, whose work runs in other processes.
    """

    def __init__(self, score: Score) -> None:
        self._score = score
        self._condition = threading.Condition()
        self._waiting: list[tuple[int, Sequence[Any], list[Any]]] = []
        self._scored: dict[int, ScoredRollouts] = {}
        self._unscored = 0
        self._error: BaseException | None = None
        self._ended = self._abandoned = False
        self.waited_s = 0.0
        """Seconds `wait` blocked: what scoring added to the call's time, past the last answer."""
        self._thread = threading.Thread(target=self._run, name="klear-scoring", daemon=True)
        self._thread.start()

    def add(self, key: int, rollouts: Sequence[Any], references: list[Any]) -> None:
        """Score ``rollouts`` against ``references`` (one each) under ``key``, once the thread is free."""
        with self._condition:
            self._raise_error()
            self._waiting.append((key, rollouts, references))
            self._unscored += 1
            self._condition.notify_all()

    def scored(self) -> dict[int, ScoredRollouts]:
        """The groups scored so far, by key, taken out (later calls give the ones scored since)."""
        with self._condition:
            self._raise_error()
            scored, self._scored = self._scored, {}
            return scored

    def wait(self) -> dict[int, ScoredRollouts]:
        """Every group not taken yet, once all that were added are scored, by key."""
        timer = time.perf_counter()
        with self._condition:
            self._condition.wait_for(lambda: self._error is not None or self._unscored == 0)
            self._raise_error()
            scored, self._scored = self._scored, {}
        self.waited_s += time.perf_counter() - timer
        return scored

    def close(self, finished: bool = True) -> None:
        """End the thread: once the groups added are scored when ``finished``; else it takes nothing more and is not
        waited for (the scorer's owner closes the scorer, which ends a batch in progress)."""
        with self._condition:
            self._ended, self._abandoned = True, not finished
            self._condition.notify_all()
        if finished:
            self._thread.join()

    def __enter__(self) -> BackgroundScoring:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close(finished=kind is None)

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._waiting or self._ended)
                if self._abandoned or not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
            try:
                scores = self._score(
                    [rollout for _, group, _ in batch for rollout in group],
                    [reference for _, _, references in batch for reference in references],
                )
                samples = sum(len(group) for _, group, _ in batch)
                if len(scores) != samples:
                    raise ValueError(f"the scorer gave {len(scores)} scores for {samples} samples")
            except BaseException as error:  # raised in the caller, which decides; this thread ends quietly
                with self._condition:
                    self._error = error
                    self._condition.notify_all()
                return
            with self._condition:
                start = 0
                for key, group, _ in batch:
                    self._scored[key] = scores.slice(start, start + len(group))
                    start += len(group)
                self._unscored -= len(batch)
                self._condition.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error
