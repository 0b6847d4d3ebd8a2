"""Which signals stop a command, and what each makes of its exit (`klear.run.loading_stop`): SIGTERM, SIGHUP and
SIGUSR1 raise `Terminated` named after the signal, SIGHUP and SIGUSR1 only where the process does not ignore them
(``nohup``), and the previous handlers come back after the command."""

import os
import signal

import pytest

from klear.run.loading_stop import Terminated, stop_outcome, stop_signals, stop_signals_raise


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
