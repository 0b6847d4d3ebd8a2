"""Test tiers: every test is marked ``unit`` except the ``end_to_end``, ``slow`` and ``gpu`` ones, so ``pytest -m
unit`` runs the fast in-process tests only (no subprocess, no command, no second process). The default run keeps the
whole suite. A module that starts a process (a command, a sandbox, the math checker, a worker pool, a second rank)
says so where it lives: ``pytestmark = pytest.mark.end_to_end  # why``; a test of a mostly in-process module takes
``@pytest.mark.end_to_end``. The rule checks itself: a unit test (its fixtures too) that starts a process fails,
naming itself and the marker, in every run that holds it."""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import klear  # noqa: F401  (sets MKL_CBWR before any test computes, as every command does)
from klear.rewards import detect_isolation

# The code reward probes its sandbox once per process, by running a small program (`detect_isolation`). Probed here,
# before any test, so a unit test that builds a code reward never starts that process, whichever tests the run
# holds and in whatever order (`pytest -m unit tests/data` as much as the whole suite).
detect_isolation()


def is_unit(item: pytest.Item) -> bool:
    # A slow or GPU test is never unit, so `-m unit` (which replaces the default `-m`) still leaves them out.
    return not any(item.get_closest_marker(name) for name in ("end_to_end", "slow", "gpu"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.unit)
    # The modules that start processes first, the in-process ones after (each module's tests in their order): the
    # two workers of the default run take modules in this order (`--no-loadscope-reorder`), so the many short
    # in-process modules even out their ends. xdist's own order (most tests first) left one-test modules, the
    # longest ones among them, for last, with the other worker idle.
    starting = {module(item) for item in items if not is_unit(item)}
    items.sort(key=lambda item: module(item) not in starting)


def module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


class ProcessStartInUnitTest(RuntimeError):
    """A unit test started a process: it belongs to the end-to-end tier."""


# Every way a test starts a process goes through one of these: subprocess (asyncio's and os.popen too) in
# Popen._execute_child, multiprocessing's spawn and forkserver in fork_exec, the fork start method, pty and os.spawn*
# in fork or forkpty, os.system in itself. multiprocessing's start() comes first, so a worker pool fails before it
# pickles anything.
ENTRY_POINTS: list[tuple[object, str, str]] = [
    (subprocess.Popen, "_execute_child", "a subprocess"),
    (_posixsubprocess, "fork_exec", "a subprocess"),
    (os, "posix_spawn", "a subprocess (os.posix_spawn)"),
    (os, "posix_spawnp", "a subprocess (os.posix_spawnp)"),
    (os, "fork", "a fork (os.fork)"),
    (os, "forkpty", "a fork (os.forkpty)"),
    (os, "system", "a shell (os.system)"),
    (multiprocessing.process.BaseProcess, "start", "a multiprocessing process"),
]


def start_refusal(nodeid: str, what: str) -> str:
    return (
        f"{nodeid} started {what} in the unit tier: mark the test `@pytest.mark.end_to_end  # why` "
        "(or its module `pytestmark = pytest.mark.end_to_end  # why`)"
    )


@contextmanager
def no_process_starts(item: pytest.Item) -> Iterator[list[str]]:
    """While the test runs, starting a process raises; the refusals are also returned, for code that swallows them."""
    refused: list[str] = []

    def refuse(owner: object, name: str, what: str) -> Callable[..., object]:
        def start(*args: object, **kwargs: object) -> object:
            refused.append(start_refusal(item.nodeid, what))
            raise ProcessStartInUnitTest(refused[-1])

        # Named as what it replaces, so a pickle that refers to it (`os.system` in a hostile payload) still pickles.
        start.__module__ = owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
        start.__qualname__ = name if isinstance(owner, types.ModuleType) else f"{owner.__qualname__}.{name}"
        return start

    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what in ENTRY_POINTS:
            if hasattr(owner, name):
                patch.setattr(owner, name, refuse(owner, name, what))
        yield refused


@contextmanager
def unit_tier_guard(item: pytest.Item) -> Iterator[None]:
    if not is_unit(item):
        yield
        return
    with no_process_starts(item) as refused:
        yield
    if refused:  # caught and dropped by the code under test: still the wrong tier
        raise ProcessStartInUnitTest(refused[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with unit_tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with unit_tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with unit_tier_guard(item):
        return (yield)
