"""A process that stops when the process that started it dies, however it dies (SIGKILL included): Linux's
``PR_SET_PDEATHSIG``. The rollout worker is killed with its trainer; a run of ``klear.compare`` gets SIGTERM when
the comparison dies, and stops at a step with its checkpoint (`klear.run.stopping`)."""

from __future__ import annotations

import sys

PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal this process gets when its parent dies."""


def on_parent_death(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies; returns whether it will (Linux only).
    Safe between ``fork`` and ``exec`` (a ``preexec_fn``): the setting outlives ``exec``."""
    if sys.platform != "linux":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
