"""Running untrusted model-written programs: isolation detection and the outer side of the sandbox.

`run_sandboxed` starts `sandbox_harness` (which runs every test of one program, see its docstring) and
enforces an outer deadline on the whole run by killing its process group. What confines the program:

- always: a fresh process group per run and per test, a CPU-time limit per test (and a CPU budget for the whole
  run) with a wall-clock backstop `WALL_FACTOR` times as long (SIGKILL of the group), so that a correct program
  is never failed because the machine is busy; rlimits on CPU time, address space, file size and open files,
  stdout/stderr
  read under a size cap, an environment with nothing of the parent's (no tokens, no proxies), a fresh
  temporary working directory removed afterwards, and every leftover process killed after each test;
- ``namespaces`` isolation (Linux, `unshare` from util-linux): new network namespace (no interface but a
  downed loopback: no connections at all), PID namespace (the program cannot see or signal any process
  outside, and everything dies with the harness), mount namespace where every mount is re-mounted read-only
  and ``/tmp``, ``/var/tmp``, ``/dev/shm`` are fresh size-capped tmpfs, IPC and UTS namespaces;
- when klear runs as root (namespaces or not): the program runs under a random unprivileged uid of its own
  (so RLIMIT_NPROC, which counts per uid, caps its process count, and it cannot touch root-owned files) with
  ``no_new_privs``. Without root, `unshare --user --map-root-user` gives the namespaces but keeps your uid,
  so there is no process-count limit (a fork bomb is contained by the PID namespace and the deadline).

``isolation="auto"`` picks namespaces when they work and otherwise falls back to the process level with a
logged warning naming what is missing; ``"namespaces"`` refuses to run without them; ``"none"`` opts out
explicitly. Not covered: reading world-readable files, CPU/memory contention with the trainer (use cgroups),
kernel exploits (use gVisor, Firecracker or nsjail with seccomp in production).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

HARNESS = str(Path(__file__).with_name("sandbox_harness.py"))
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_NAMESPACE_FLAGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
IsolationLevel = Literal["auto", "namespaces", "none"]
WALL_FACTOR = 10.0
"""The wall-clock backstop, in CPU limits: a test is stopped after this many times its CPU seconds of wall time
(a program that sleeps or blocks uses none), and a run after this many times its CPU budget. A program that gets
a tenth of a core still finishes; at a twentieth, the load is what needs fixing."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. ``timeout`` is CPU seconds per test (user + system time of the program, whatever the
    machine's load; `WALL_FACTOR` times as much wall time stops a program that waits)."""

    timeout: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 32
    startup_timeout: float = 10.0  # allowance for starting Python and setting up the namespaces, per run


@dataclass(frozen=True)
class Isolation:
    """How programs are confined on this machine (see the module docstring)."""

    mode: Literal["namespaces", "process"]
    command_prefix: tuple[str, ...]
    drop_uid: bool
    missing: str = ""  # what full isolation would need and is not there; empty when nothing is missing


@dataclass(frozen=True)
class SandboxRun:
    """The outcome of one program on all its tests.

    ``status`` is "ok" when the harness reported (whatever the tests did); "timeout" / "error" when the run as a
    whole was killed or broke. ``tests`` holds one of passed, wrong, error, timeout, output_limit, not_run per
    test; ``stderr`` the tail of each test's stderr; ``budget_spent`` is True when tests were not run because
    the run's ``total_timeout`` had passed.
    """

    status: Literal["ok", "timeout", "error"]
    tests: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    detail: str = ""
    isolation: dict[str, Any] = field(default_factory=dict)
    budget_spent: bool = False


def detect_isolation(requested: IsolationLevel = "auto") -> Isolation:
    """The strongest isolation available for ``requested``, probed once per process by running a small
    program through the real sandbox (so "available" means "works here", not "the binary exists")."""
    return _detect(requested)


@functools.cache
def _detect(requested: IsolationLevel) -> Isolation:
    if requested not in ("auto", "namespaces", "none"):
        raise ValueError(f"unknown isolation {requested!r}; choose auto, namespaces or none")
    root = os.geteuid() == 0
    missing = "namespaces (disabled by isolation='none')"
    if requested != "none":
        prefix, missing = _namespace_command(root)
        if not missing:
            missing = _smoke_test(Isolation("namespaces", prefix, drop_uid=root))
        if not missing:
            if not root:
                logger.warning(
                    "code sandbox: not running as root, so programs keep your uid inside a user namespace and "
                    "RLIMIT_NPROC is not set; fork bombs are contained only by the PID namespace and the deadline"
                )
            return Isolation("namespaces", prefix, drop_uid=root)
        if requested == "namespaces":
            raise RuntimeError(f"code sandbox: isolation='namespaces' was requested but {missing}")
    # Without a mount namespace the unprivileged uid can only import Python if its installation is readable.
    drop_uid = root and _smoke_test(Isolation("process", (), drop_uid=True)) == ""
    if not drop_uid:
        problem = _smoke_test(Isolation("process", (), drop_uid=False))
        if problem:
            raise RuntimeError(f"code sandbox: programs cannot run on this machine at all: {problem}")
    logger.warning(
        "code sandbox: process isolation only, because %s. Programs get rlimits, a deadline, a stripped "
        "environment and a private temp dir, %s, but they CAN open network connections, see other processes "
        "and write wherever their uid may. Install util-linux `unshare` / enable user namespaces for more; "
        "isolation='namespaces' makes this an error.",
        missing,
        "under a random unprivileged uid"
        if drop_uid
        else "but under YOUR uid (no process-count limit"
        + (": the Python installation is not readable by an unprivileged uid)" if root else ")"),
    )
    return Isolation("process", (), drop_uid=drop_uid, missing=missing)


_SMOKE_PROGRAM = "import decimal, heapq, socket\nopen('probe.txt', 'w').write('ok')\nprint(open('probe.txt').read())\n"


def _smoke_test(isolation: Isolation) -> str:
    """Empty when a small program (stdlib imports, a file in its work dir) runs under ``isolation``, else why not."""
    run = run_sandboxed(_SMOKE_PROGRAM, [{"kind": "stdio", "input": ""}], ["ok"], SandboxLimits(timeout=30), isolation)
    if run.status == "ok" and run.tests == ["passed"]:
        return ""
    return f"a probe program failed under {isolation.mode} isolation: {run.detail or run.tests} {run.stderr}"


def _namespace_command(root: bool) -> tuple[tuple[str, ...], str]:
    """The `unshare` command line, and what is missing for it ("" when nothing)."""
    if not sys.platform.startswith("linux"):
        return (), f"Linux namespaces are not available on {sys.platform}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return (), "the `unshare` command (util-linux) was not found"
    return (unshare, *(() if root else ("--user", "--map-root-user")), *_NAMESPACE_FLAGS), ""


def run_wall_limit(total_timeout: float, limits: SandboxLimits) -> float:
    """The most wall-clock seconds one `run_sandboxed` call takes with a CPU budget of ``total_timeout``: its
    backstop, `WALL_FACTOR` times the budget, and the start-up allowance after which the whole run is killed."""
    return WALL_FACTOR * total_timeout + limits.startup_timeout


def run_sandboxed(
    code: str,
    tests: list[dict[str, Any]],
    expected: list[Any],
    limits: SandboxLimits,
    isolation: Isolation,
    stop_on_failure: bool = False,
    total_timeout: float | None = None,
    prelude: str = "",
) -> SandboxRun:
    """Run ``code`` on each test and compare with ``expected`` inside the sandbox.

    A test is ``{"kind": "stdio", "input"}``, ``{"kind": "call", "fn_name", "args", "kwargs", "or_first"?}``,
    ``{"kind": "code", "source"}`` or ``{"kind": "pytest", "source"}`` (for the last two the ``expected`` entry
    is unused: the source's own asserts decide). ``prelude`` is Python source run in the program's namespace
    before it, for every test.
    ``stop_on_failure`` skips the remaining tests after the first that crashes, times out or fails a code
    test's check (all-or-nothing scoring needs no more). ``total_timeout`` is the CPU budget of all the tests
    together: a test gets ``limits.timeout`` CPU seconds or what is left of the budget if less, and tests not
    started once it is spent (or once `WALL_FACTOR` times it has passed on the wall clock) are ``not_run``.
    None: every test may use its whole timeout (``len(tests) * (limits.timeout + 0.5)``). The whole run is
    killed ``limits.startup_timeout`` seconds after its wall-clock backstop.
    """
    if total_timeout is None:
        total_timeout = len(tests) * (limits.timeout + 0.5)
    if total_timeout <= 0:
        raise ValueError(f"total_timeout must be positive, got {total_timeout}")
    namespaces = isolation.mode == "namespaces"
    workdir = None if namespaces else tempfile.mkdtemp(prefix="klear-sandbox-")
    job = {
        "code": code,
        "prelude": prelude,
        "tests": tests,
        "timeout": limits.timeout,
        "total_timeout": total_timeout,
        "wall_factor": WALL_FACTOR,
        "memory_bytes": limits.memory_mb * 2**20,
        "max_output_bytes": limits.max_output_bytes,
        "max_file_bytes": limits.max_file_bytes,
        "max_processes": limits.max_processes,
        "pid_namespace": namespaces,
        "harden_mounts": namespaces,
        "drop_uid": isolation.drop_uid,
        "workdir": workdir,
        "stop_on_failure": stop_on_failure,
    }
    payload = _frame(job) + _frame({"expected": expected})
    try:
        process = subprocess.Popen(
            [*isolation.command_prefix, sys.executable, "-I", HARNESS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_ENV,
            cwd="/",
            start_new_session=True,
        )
        return _collect(process, payload, run_wall_limit(total_timeout, limits))
    except OSError as error:
        return SandboxRun("error", detail=f"could not start the sandbox: {error}")
    finally:
        if workdir is not None:
            _remove_tree(workdir)


def _collect(process: subprocess.Popen[bytes], payload: bytes, timeout: float) -> SandboxRun:
    try:
        stdout, stderr = process.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        try:
            process.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:  # only possible without a PID namespace: an escaped process holds a pipe
            logger.warning("code sandbox: a killed program left a process holding its pipes (pid %d)", process.pid)
        return SandboxRun("timeout", detail=f"the sandbox ran past its {timeout:g}s deadline and was killed")
    if process.returncode != 0 or not stdout:
        tail = stderr.decode("utf-8", "replace")[-500:]
        return SandboxRun("error", detail=f"sandbox harness exited with {process.returncode}: {tail}")
    try:
        report = json.loads(stdout)
    except ValueError:
        return SandboxRun("error", detail=f"unreadable sandbox report: {stdout[:200]!r}")
    tests = [result["status"] for result in report["results"]]
    stderr_tails = [result["stderr"] for result in report["results"]]
    return SandboxRun("ok", tests, stderr_tails, isolation=report["isolation"], budget_spent=report["budget_spent"])


def _frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return len(data).to_bytes(8, "big") + data


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(function: Any, target: str, _: Any) -> None:
        os.chmod(os.path.dirname(target), 0o700)
        function(target)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as error:
        logger.warning("code sandbox: could not remove its temp dir %s: %s", path, error)
