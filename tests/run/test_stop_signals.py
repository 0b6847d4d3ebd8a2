"""Which signals stop a command, and what each makes of its exit (`klear.run.loading_stop`): SIGTERM, SIGHUP and
SIGUSR1 raise `Terminated` named after the signal, SIGHUP and SIGUSR1 only where the process does not ignore them
(``nohup``), and the previous handlers come back after the command."""

import os
import signal
from types import SimpleNamespace

import pytest
import torch

from klear.run.loading_stop import Terminated, stop_outcome, stop_signals, stop_signals_raise
from klear.run.stopping import SignalStop, StopRequested


@pytest.mark.parametrize(
    ("stop", "outcome"),
    [
        (Terminated("SIGTERM"), (143, "stopped", "SIGTERM")),
        (Terminated("SIGHUP"), (129, "stopped", "SIGHUP")),
        (Terminated("SIGUSR1"), (138, "stopped", "SIGUSR1")),
        (KeyboardInterrupt(), (130, "interrupted", "Ctrl-C")),
    ],
)
def test_each_stop_has_its_exit_status_and_words(stop, outcome):
    assert stop_outcome(stop) == outcome


def test_sighup_and_sigusr1_stop_a_command_unless_it_was_started_ignoring_them():
    previous = {signum: signal.signal(signum, signal.SIG_DFL) for signum in (signal.SIGHUP, signal.SIGUSR1)}
    try:
        assert stop_signals() == [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1]
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
        assert stop_signals() == [signal.SIGTERM, signal.SIGUSR1]
        with stop_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing is raised
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1], ids=["SIGTERM", "SIGHUP", "SIGUSR1"]
)
def test_a_stop_signal_raises_terminated_named_after_it_and_handlers_come_back(signum):
    before = signal.getsignal(signum)
    with pytest.raises(Terminated) as stop, stop_signals_raise():
        os.kill(os.getpid(), signum)
        signal.sigtimedwait([], 0)  # a bytecode boundary, where Python runs the handler
    assert str(stop.value) == signal.Signals(signum).name
    assert signal.getsignal(signum) is before


@pytest.mark.parametrize(
    ("cause", "stops_there"), [(signal.SIGINT, False), (signal.SIGTERM, True)], ids=["Ctrl-C", "SIGTERM"]
)
def test_a_step_start_stops_on_ctrl_c_only_before_the_first_step(cause, stops_there):
    """The agreement point at a step's start (`SignalStop.on_train_batch_start`) stops the fit's first step on any
    signal, there being nothing to save yet; after it, on SIGTERM alone: a Ctrl-C there goes on to the step's end,
    where the step is saved, so the step before it, which its own end point did not save, is not lost."""
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")))
    stop = SignalStop(on_forced_exit=print)
    with pytest.raises(StopRequested):
        stop.cause = cause
        stop.signalled.set()
        stop.on_train_batch_start(trainer, None, None, 0)

    stop = SignalStop(on_forced_exit=print)
    stop.on_train_batch_start(trainer, None, None, 0)  # a step of this fit began, with no signal
    stop.cause = cause
    stop.signalled.set()
    if stops_there:
        with pytest.raises(StopRequested):
            stop.on_train_batch_start(trainer, None, None, 1)
    else:
        stop.on_train_batch_start(trainer, None, None, 1)  # on to the end of this step
