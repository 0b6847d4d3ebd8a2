"""Which signals stop a command, and what each makes of its exit (`klear.run.loading_stop`): SIGTERM and SIGHUP
raise `Terminated` named after the signal, SIGHUP only where the process does not ignore it (``nohup``), and the
previous handlers come back after the command."""

import os
import signal

import pytest

from klear.run.loading_stop import Terminated, stop_outcome, stop_signals, stop_signals_raise


@pytest.mark.parametrize(
    ("stop", "outcome"),
    [
        (Terminated("SIGTERM"), (143, "stopped", "SIGTERM")),
        (Terminated("SIGHUP"), (129, "stopped", "SIGHUP")),
        (KeyboardInterrupt(), (130, "interrupted", "Ctrl-C")),
    ],
)
def test_each_stop_has_its_exit_status_and_words(stop, outcome):
    assert stop_outcome(stop) == outcome


def test_sighup_stops_a_command_unless_it_was_started_ignoring_it():
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        assert stop_signals() == [signal.SIGTERM, signal.SIGHUP]
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
        assert stop_signals() == [signal.SIGTERM]
        with stop_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing is raised
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_raises_terminated_named_after_it_and_handlers_come_back(signum):
    before = signal.getsignal(signum)
    with pytest.raises(Terminated) as stop, stop_signals_raise():
        os.kill(os.getpid(), signum)
        signal.sigtimedwait([], 0)  # a bytecode boundary, where Python runs the handler
    assert str(stop.value) == signal.Signals(signum).name
    assert signal.getsignal(signum) is before
