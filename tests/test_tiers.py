"""The test tiers check themselves (tests/conftest.py): in the unit tier every way of starting a process is refused with
one line naming the test and the marker, a refusal the code under test swallows still fails the test, and the
entry points come back unchanged afterwards. Nothing here starts a process: each attempt is refused first."""

import _posixsubprocess
import contextlib
import multiprocessing
import os
import pickle
import re
import subprocess

import pytest

from tests.conftest import ProcessStartInUnitTest, is_unit, no_process_starts, unit_tier_guard


def refusal(request: pytest.FixtureRequest, what: str) -> str:
    return re.escape(
        f"{request.node.nodeid} started {what} in the unit tier: mark the test `@pytest.mark.end_to_end  # why` "
        "(or its module `pytestmark = pytest.mark.end_to_end  # why`)"
    )


def test_this_module_is_in_the_unit_tier(request):
    assert is_unit(request.node) and request.node.get_closest_marker("unit") is not None
    request.node.add_marker(pytest.mark.end_to_end)
    assert not is_unit(request.node)


@pytest.mark.parametrize(
    ("start", "what"),
    [
        (lambda: subprocess.run(["true"], check=True), "a subprocess"),
        (lambda: subprocess.Popen("true", shell=True), "a subprocess"),
        (lambda: os.system("true"), "a shell (os.system)"),
        (lambda: os.fork(), "a fork (os.fork)"),
        (lambda: os.posix_spawn("/bin/true", ["true"], {}), "a subprocess (os.posix_spawn)"),
        (lambda: multiprocessing.get_context("fork").Process(target=print).start(), "a multiprocessing process"),
        (lambda: multiprocessing.get_context("spawn").Process(target=print).start(), "a multiprocessing process"),
    ],
    ids=["run", "popen-shell", "system", "fork", "posix_spawn", "mp-fork", "mp-spawn"],
)
def test_every_way_of_starting_a_process_is_refused_with_one_line(request, start, what):
    with (
        no_process_starts(request.node) as refused,
        pytest.raises(ProcessStartInUnitTest, match=refusal(request, what)),
    ):
        start()
    assert len(refused) == 1 and "\n" not in refused[0]


def test_a_swallowed_refusal_still_fails_the_test(request):
    with (
        pytest.raises(ProcessStartInUnitTest, match=refusal(request, "a subprocess")),
        unit_tier_guard(request.node),
        contextlib.suppress(ProcessStartInUnitTest),  # as code that falls back when a command fails would
    ):
        subprocess.run(["true"], check=True)


def test_the_entry_points_are_restored_and_pickle_by_name(request):
    before = (
        subprocess.Popen._execute_child,
        _posixsubprocess.fork_exec,
        os.system,
        os.fork,
        multiprocessing.process.BaseProcess.start,
    )
    with no_process_starts(request.node):
        assert pickle.loads(pickle.dumps(os.system)) is os.system  # a pickle naming os.system still pickles
    assert (
        subprocess.Popen._execute_child,
        _posixsubprocess.fork_exec,
        os.system,
        os.fork,
        multiprocessing.process.BaseProcess.start,
    ) == before
