"""Stopping a run on SIGTERM, SIGHUP or Ctrl-C: every rank at the same step boundary, within seconds, the last
checkpoint intact.

Cluster schedulers stop a job with SIGTERM, sent to every process of the job (SLURM at its time limit or on
preemption, Kubernetes, a ``kill`` of the process group), then SIGKILL after a grace period. Lightning's own
SIGTERM handler runs a collective (a broadcast from rank 0) inside the signal handler, wherever each rank happens
to be, and forwards the signal to the ranks it launched, so a rank signalled twice or in the middle of another
collective (an evaluation's gather) waits forever for a partner that never comes. Here instead:

- the signal only wakes a watcher thread (``signal.set_wakeup_fd``: the interpreter writes the signal number to a
  pipe from its C-level handler, so it is seen even while the main thread is blocked in a collective);
- the ranks agree to stop at the next agreement point, one ``all_reduce(MAX)`` of the flag that every rank reaches
  (a rank that was not signalled stops too), and all raise :class:`StopRequested` there: no new step, evaluation
  or checkpoint is started, and a checkpoint being written when the signal came completes first. The points are
  the start and the end of each training step (at the end, `klear.run.checkpoints.StepCheckpoint` saves the
  step first, due or not, so a stop there loses no step) and, inside a step (:meth:`SignalStop.agree`, which the
  stages call), between its generation and its update, between its optimizer updates and between the parts of an
  evaluation, so a step longer than the grace stops within one chunk of work; what a step stopped inside had done
  is discarded (its checkpoint is saved only once it completes), so the last complete checkpoint is the one before
  it;
- a rank that has not stopped within :data:`GRACE_S` seconds, or that receives a second SIGTERM, exits at once
  (after rank 0 printed the summary and removed a half-written checkpoint): the last complete checkpoint is the
  one named by the summary either way. A SIGTERM within :data:`REPEAT_S` of the first is the same stop, not a
  second one: a scheduler that signals every process of a job reaches a rank both directly and through the
  launcher that forwards it (``torchrun``, ``klear.compare``).

The exit status is 143 (`klear.run.loading_stop.EXIT_SIGTERM`: 128 + 15, what a shell reports for a process ended by
SIGTERM).

SIGHUP, which a run receives when its terminal closes (an ssh connection that drops, the shell that started it in
the background exiting), stops it the same way, with exit status 129: its output is first taken off the closed
terminal (`klear.runtime.terminal.detach_terminal`), so the stop writes ``report.md`` and ``summary.json`` and
releases the folder's lock instead of dying on its next line. The terminal usually sends it twice (to the process
group, and through the shell): `REPEAT_S` makes that one stop. A run under ``nohup`` ignores it, as asked.
SIGUSR1, which SLURM sends ahead of a time limit with ``--signal=USR1@N`` (Lightning's advice for its requeue), is a
stop too, with exit status 138, where its default action would end the run at once.
Before the fit (the config, the data and the model loading), `klear.run.loading_stop` stops each rank at once.
Lightning's SLURM auto-requeue is switched off by :func:`cluster_plugins`: its SIGUSR1 handler saves a checkpoint
with collectives inside a signal handler too (the same hang) and writes an ``hpc_ckpt_N.ckpt`` that klear never
resumes from. `docs/scale-out.md` says how to stop and requeue under SLURM instead.

A run that diverges stops too (:class:`Diverged`, exit status :data:`EXIT_DIVERGED`): :func:`check_finite` looks at
an update's loss, gradient norm and log-prob metrics once they are reduced across ranks, and before the optimizer
step commits them, so every rank sees the same values and stops at the same update without a collective of its
own, no NaN reaches the weights (gradient clipping would spread a NaN norm over every gradient), and nothing
samples from a policy that diverged. The step is discarded; the last checkpoint is the one before it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import lightning as L
import torch

from klear.run.loading_stop import signal_outcome, stop_signals
from klear.runtime.terminal import HANGUP, detach_on_hangup, detach_terminal

log = logging.getLogger(__name__)

EXIT_DIVERGED = 4
"""The exit status of a run stopped by a non-finite loss, gradient norm or log-prob (:class:`Diverged`)."""
GRACE_S = 20.0
"""Seconds a rank may take from SIGTERM to its stop before it exits regardless (SLURM's and Kubernetes' default
grace before SIGKILL is 30 s)."""
REPEAT_S = 1.0
"""Seconds after the first SIGTERM (or SIGHUP) within which another one is the same stop, delivered twice (the
module docstring): only a signal later than that stops a rank at once."""


NOTICE = (
    "warning: {signal} received: stopping at the end of the step in progress, which is saved, or within it, which "
    "is then discarded; the last complete checkpoint is kept (a second SIGTERM stops at once)\n"
)
CTRL_C_NOTICE = (
    "warning: Ctrl-C received: stopping at the end of the step in progress, which is saved (press Ctrl-C again to "
    "stop at once)\n"
)
AT_STEP_END, AT_ONCE = 1, 2
"""How soon a stop comes, agreed across the ranks as the largest any rank asks: Ctrl-C stops at the end of the step
in progress (the user is there to press it again), SIGTERM and SIGHUP at the next agreement point, inside a step
too, within the grace."""


class StopRequested(Exception):
    """Every rank stops at this step boundary: SIGTERM, SIGHUP or Ctrl-C (the message) reached at least one of them.
    ``completed``: the steps the run completed, where the stop came after a step that Lightning does not count yet
    (its end, `klear.run.checkpoints.StepCheckpoint.stop_point`); None elsewhere."""

    completed: int | None = None


class Diverged(RuntimeError):
    """An update's ``metric`` is not finite (``value``): every rank stops at this update, before its optimizer step."""

    def __init__(self, metric: str, value: float) -> None:
        super().__init__(f"{metric} is {value}")
        self.metric = metric
        self.value = value


def check_finite(values: Mapping[str, float], names: Iterable[str]) -> None:
    """Raise :class:`Diverged` for the first of ``names`` whose value in ``values`` (reduced across ranks, so the
    same on every rank) is not finite; names without a value are skipped."""
    for name in names:
        value = values.get(name)
        if value is not None and not math.isfinite(value):
            raise Diverged(name, value)


class SignalStop(L.Callback):
    """The SIGTERM, SIGHUP and SIGUSR1 handling of the module docstring, for the lifetime of :meth:`watching`
    (around ``fit``), and Ctrl-C's: the first stops the run at the end of the step in progress, which is saved (a
    run interrupted at a step, exit status 130; no agreement point inside the step stops it, and no forced exit: the
    user is there to press it again), a second one a second or more later raises ``KeyboardInterrupt`` at once,
    Lightning's own graceful shutdown; a SIGTERM, SIGHUP or SIGUSR1 after a Ctrl-C makes the stop theirs.

    Args:
        on_forced_exit: called once, from the watcher thread, before a forced exit (rank 0 prints the summary
            there); its argument says why the run is forced to exit.
    """

    def __init__(self, on_forced_exit: Callable[[str], None]) -> None:
        self.on_forced_exit = on_forced_exit
        self.signalled = threading.Event()
        self.closing = threading.Lock()
        """Held by whoever ends the run (the main thread's summary or a forced exit), so that only one does."""
        self.active = False
        """Whether :meth:`watching` is in force."""
        self.first = 0.0
        """When the first SIGTERM, SIGHUP or Ctrl-C came (``time.monotonic``)."""
        self.cause = signal.SIGTERM
        """The first signal that came: the stop's name and exit status (:attr:`exit_status`)."""
        self.signals: list[signal.Signals] = [signal.SIGTERM]
        """The signals that stop the run (`klear.run.loading_stop.stop_signals`), read as the watching starts."""
        self.ctrl_c = True
        """Whether Ctrl-C stops the run this way: not where it was ignored as the watching started (a background job
        of a shell without job control)."""
        self.stepped = False
        """Whether a step of this fit has started (:meth:`on_train_batch_start`)."""
        self.grace: threading.Timer | None = None
        """The forced exit after `GRACE_S`, armed by the first SIGTERM and cancelled when the watching ends: a
        process that lives on after ``fit`` (the Python API, a test) is never ended by a stop it already made."""

    # ------------------------------------------------------------------ the signal, seen by the watcher thread

    @property
    def exit_status(self) -> int:
        """The exit status of the signal that stopped the run: 143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C."""
        return signal_outcome(self.cause)[0]

    def outcome(self) -> tuple[int, str, str]:
        """The run's exit status, the word for its end and the detail of its status: ``(143, "stopped", ": SIGTERM")``,
        ``(129, "stopped", ": SIGHUP")`` or ``(130, "interrupted", "")`` (a run interrupted with Ctrl-C)."""
        code, word, cause = signal_outcome(self.cause)
        return code, word, "" if self.cause == signal.SIGINT else f": {cause}"

    def watching(self) -> _Watching:
        return _Watching(self)

    def _install(self) -> None:
        # A Python-level handler that does nothing: the C-level one then writes to the wakeup fd instead of the
        # default action (death). Lightning registers its own handler when `fit` starts: on_train_start undoes it.
        # SIGHUP's takes the output off the closed terminal in the main thread, before its next write.
        for stop in self.signals:
            signal.signal(stop, detach_on_hangup if stop == HANGUP else _ignore)
        if self.ctrl_c:
            signal.signal(signal.SIGINT, self._ctrl_c)

    def _ctrl_c(self, signum: int, frame) -> None:
        """The Python-level Ctrl-C handler, in the main thread: the first is the watcher's to note; one a second or
        more after the stop began stops the run at once."""
        if self.signalled.is_set() and time.monotonic() - self.first >= REPEAT_S:
            raise KeyboardInterrupt

    def _watch(self, read_fd: int) -> None:
        while True:
            try:
                received = os.read(read_fd, 64)
            except OSError:
                return
            if not received:  # the write end was closed: the run is over
                os.close(read_fd)
                return
            stops = [stop for stop in self.signals if stop in received]
            if self.ctrl_c and signal.SIGINT in received and not self.signalled.is_set():
                stops.append(signal.SIGINT)  # a later one is the main thread's (`_ctrl_c`)
            if not stops:  # other Python-handled signals are the main thread's
                continue
            if HANGUP in stops:
                detach_terminal()  # as the main thread's handler does, should that thread be blocked
            if self.signalled.is_set() and not (self.cause == signal.SIGINT and stops[0] != signal.SIGINT):
                if time.monotonic() - self.first < REPEAT_S:
                    continue  # the same stop, delivered twice
                self._force(f"a second {stops[0].name}")
            self.first, self.cause = time.monotonic(), stops[0]  # a SIGTERM after Ctrl-C: now SIGTERM's stop
            if self.cause != signal.SIGINT:  # Ctrl-C's user presses it again instead
                reason = f"no stop within {GRACE_S:g} s of {self.cause.name}"
                self.grace = threading.Timer(GRACE_S, self._force, args=(reason,))
                self.grace.daemon = True
                self.grace.start()  # armed before the flag is seen, so that the end of the watching disarms it
            self.signalled.set()
            notice = CTRL_C_NOTICE if self.cause == signal.SIGINT else NOTICE.format(signal=self.cause.name)
            with contextlib.suppress(OSError):  # not through logging: its locks may be held by the interrupted thread
                os.write(2, notice.encode())

    def _force(self, reason: str) -> None:
        if not self.active:  # the watching ended (fit returned) while the timer fired
            return
        if self.closing.acquire(blocking=False):
            try:
                self.on_forced_exit(reason)
            finally:
                os._exit(self.exit_status)

    # ------------------------------------------------------------------ the agreed stop, in the main thread

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._install()

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch, batch_idx: int) -> None:
        """The agreement point at a step's start: any stop before the fit's first step, which has nothing to save;
        after it, a stop `AT_ONCE` only. A Ctrl-C that came after the previous step's end point waits for the end of
        this step, which is saved, instead of stopping here with the previous step unsaved."""
        self.agree(trainer.strategy.root_device, inside=self.stepped)
        self.stepped = True

    def agree(self, device: torch.device, inside: bool) -> None:
        """An agreement point: raise :class:`StopRequested` on every rank when any was signalled (``inside`` a step:
        by a signal that stops `AT_ONCE`). Every rank must call it at the same place of the same step (one
        collective); a stage calls it through :func:`agreement_point`."""
        asked = 0 if not self.signalled.is_set() else AT_STEP_END if self.cause == signal.SIGINT else AT_ONCE
        agreed = stop_agreed(asked, device)
        if agreed > (AT_STEP_END if inside else 0):
            if not asked:  # a rank that saw no signal takes the stop of those that did
                self.cause = signal.SIGINT if agreed == AT_STEP_END else signal.SIGTERM
            raise StopRequested(self.cause.name)


def agreement_point(trainer: L.Trainer, inside: bool = True) -> Callable[[], None] | None:
    """The agreement point on a stop ``inside`` a step of ``trainer``'s fit, or at a step's end
    (:meth:`SignalStop.agree` on its device), or ``None`` when no :class:`SignalStop` watches it (the Python API
    without ``klear.fit``)."""
    for callback in trainer.callbacks:
        if isinstance(callback, SignalStop):
            device = trainer.strategy.root_device
            return lambda: callback.agree(device, inside)
    return None


def stop_agreed(asked: int, device: torch.device) -> int:
    """The largest stop any rank asks for (0: none, `AT_STEP_END`, `AT_ONCE`): a collective every rank calls at the
    same point (``asked`` alone in a single process)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return asked
    flag = torch.tensor([asked], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return int(flag.item())


class _Watching:
    """The context of :meth:`SignalStop.watching`: the handler, the wakeup pipe and its watcher thread."""

    def __init__(self, stop: SignalStop) -> None:
        self.stop = stop

    def __enter__(self) -> SignalStop:
        self.stop.signals = stop_signals()  # before a handler of ours hides whether SIGHUP was ignored
        self.stop.ctrl_c = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        handled = [*self.stop.signals, *([signal.SIGINT] if self.stop.ctrl_c else [])]
        self.previous = {stop: signal.getsignal(stop) for stop in handled}
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # the interpreter's C handler must never block on it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.stop._install()
        self.stop.active = True
        threading.Thread(target=self.stop._watch, args=(self.read_fd,), name="klear-sigterm", daemon=True).start()
        return self.stop

    def __exit__(self, *exc_info) -> None:
        self.stop.active = False
        if self.stop.grace is not None:
            self.stop.grace.cancel()
        signal.set_wakeup_fd(self.previous_fd)
        for stop, handler in self.previous.items():
            signal.signal(stop, handler)
        os.close(self.write_fd)  # the watcher reads EOF, closes its end and ends


def _ignore(signum: int, frame) -> None:
    """The Python-level SIGTERM handler: the watcher thread acts on the signal."""


def cluster_plugins() -> list:
    """Under SLURM, its environment with Lightning's auto-requeue off (see the module docstring); else none."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []
