"""The trusted side of the sandbox: runs *inside* it and executes the untrusted program once per test.

Started by `sandbox.run_sandboxed` as ``python -I sandbox_harness.py`` (by path, standard library only) in a
fresh process group and, where the OS allows, as PID 1 of new PID/mount/network/IPC namespaces. It

1. reads the job (program + test inputs, limits) from stdin, without buffering ahead;
2. hardens the namespace when asked: every mount re-mounted read-only, fresh size-capped tmpfs on ``/tmp``,
   ``/var/tmp`` and ``/dev/shm``, the work directory ``/tmp/work`` owned by the sandbox uid;
3. for each test forks a child that sets rlimits (CPU, address space, file size, open files, processes),
   ``no_new_privs``, drops to a random unprivileged uid (when started as root) and execs the program, with
   stdin fed from the test and stdout/stderr read through pipes under a size cap. Time is the child's CPU time
   (user + system), so a busy machine never fails a correct program: the per-test ``timeout``, cut short by
   what is left of the job's ``total_timeout`` (a CPU budget), is watched from ``/proc`` while the child runs
   and enforced by ``RLIMIT_CPU`` to the next second, and the CPU time the child used (``wait4``) decides after
   it exits. A program that waits without computing (sleeps, blocks) is stopped by a wall-clock backstop of
   ``wall_factor`` times its CPU limit, and the job's tests by ``wall_factor`` times its budget. Tests not
   started when the budget (or the backstop) is spent are ``not_run``, and so are the rest after a failure
   with ``stop_on_failure``;
4. after each test kills every process left (``kill(-1)`` from PID 1; the subreaper walk otherwise), so a
   background grandchild cannot outlive its test or disturb the next one;
5. only then reads the expected outputs (so they never share memory with a running program, which could
   otherwise read them from a forked copy of this process) and writes one JSON verdict per test to stdout.

Tests are of four kinds; the job's ``prelude`` (trusted source, compiled on its own) runs in the program's
namespace before the program in each. ``stdio`` runs the program as ``__main__`` with the test's stdin and
compares its stdout; ``call`` runs it as module ``solution``, calls a function and compares the JSON of its
return value (or, with ``or_first``, of the first item of a list); ``code`` runs it as module ``solution``, then
the test's (trusted) Python source in the same namespace and child, as ``__main__``; ``pytest`` writes the
test's pytest file and ``solution.py`` (the program, for tracebacks) to the work directory and runs pytest
in-process, the program being imported from memory (prelude, then program) when the file imports ``solution``.
pytest itself is imported in the child only, after it dropped its privileges; this file uses the standard
library alone. A code or pytest test passes only when, after the check returned, the child writes a random
per-test token to the result pipe and exits 0, so a program that exits early (``os._exit(0)``) never passes. A
failed ``assert`` (pytest: a failed test) is ``wrong``; any other exception, a ``SystemExit`` of any code, an
exit before the token, or a pytest run that collected nothing, broke in collection, skipped a test or never
imported the program is ``error``. Before check code runs (and once pytest imported the program), the
``builtins`` module and ``__builtins__`` are restored to what they were before the program and trace/profile
hooks are removed. What is not guarded is listed
in `code_reward`'s docstring.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import resource
import select
import signal
import sys
import time
import traceback
from typing import Any

_LINUX = sys.platform.startswith("linux")
# Run by path with -I, so the sibling modules are found through this file's directory.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_pytest import run_pytest  # noqa: E402

if _LINUX:
    from sandbox_mounts import harden_mounts, prctl
del sys.path[0]

_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 4, 36, 38
_STDERR_CAP = 2048
_CHECKED = ("code", "pytest")  # the kinds whose own checks decide, confirmed by the token


def main() -> None:
    job = _read_message()
    pid1 = job["pid1"] = job["pid_namespace"] and os.getpid() == 1
    info = {"pid1": pid1, "uid": None, "readonly_mounts": 0, "readonly_failures": 0, "tmpfs": []}
    if _LINUX:
        prctl(_PR_SET_DUMPABLE, 0)  # the program may not ptrace or read the memory of this process
        if not pid1:
            prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphaned grandchildren come back to us to be killed
    workdir = job["workdir"]
    if job["harden_mounts"]:
        workdir = harden_mounts(info)
    if job["drop_uid"]:
        info["uid"] = 100_000 + int.from_bytes(os.urandom(4), "big") % 2**30  # its own uid: own NPROC count
        os.chown(workdir, info["uid"], info["uid"])
    # The budget of the tests, after the set-up above: CPU seconds, and a wall-clock backstop for waiting programs.
    cpu_left, wall = job["total_timeout"], job["wall_factor"]
    deadline = time.monotonic() + wall * job["total_timeout"]
    runs: list[dict[str, Any]] = []
    budget_spent = False
    for test in job["tests"]:
        if cpu_left <= 0 or time.monotonic() >= deadline:
            budget_spent = True
        if budget_spent or (job["stop_on_failure"] and runs and _failed(runs[-1])):
            runs.append({"status": "not_run", "stdout": b"", "result": b"", "stderr": b"", "token": None, "cpu": 0.0})
            continue
        cpu_limit = min(job["timeout"], cpu_left)
        test_deadline = min(deadline, time.monotonic() + wall * cpu_limit)
        runs.append(_run_test(job, test, workdir, info["uid"], cpu_limit, test_deadline))
        cpu_left -= runs[-1]["cpu"]
    expected = _read_message()["expected"]  # only now: no program is running any more
    verdicts = [_verdict(test, run, want) for test, run, want in zip(job["tests"], runs, expected, strict=True)]
    report = {"results": verdicts, "isolation": info, "budget_spent": budget_spent}
    _write_all(1, json.dumps(report).encode())


def _failed(run: dict[str, Any]) -> bool:
    """Whether a test already failed as far as we can tell before reading the expected outputs."""
    return run["status"] != "ok" or (run["token"] is not None and run["result"] != run["token"])


def _run_test(
    job: dict[str, Any], test: dict[str, Any], workdir: str, uid: int | None, cpu_limit: float, deadline: float
) -> dict:
    stdin_r, stdin_w = os.pipe()  # a pipe even when empty: the child may be given its ownership (see _child)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    # What a code test's child writes once the check source has returned; unknown to the program beforehand.
    token = os.urandom(16).hex().encode() if test["kind"] in _CHECKED else None
    pid = os.fork()
    if pid == 0:
        _child(job, test, workdir, uid, (stdin_r, out_w, err_w, res_w), token, cpu_limit)
    for fd in (stdin_r, out_w, err_w, res_w):
        os.close(fd)
    exit_fd = _exit_fd(pid)
    pending = test["input"].encode() if test["kind"] == "stdio" else b""
    if pending:
        os.set_blocking(stdin_w, False)
    else:
        os.close(stdin_w)
        stdin_w = -1
    pipes = {out_r: _Capture(job["max_output_bytes"], True), res_r: _Capture(job["max_output_bytes"], True)}
    pipes[err_r] = _Capture(_STDERR_CAP, False)
    status, exited = None, None
    while exited is None and status is None:
        remaining = deadline - time.monotonic()
        cpu_left = cpu_limit - _cpu_seconds(pid)
        if remaining <= 0 or cpu_left <= 0:
            status = "timeout"
            break
        # CPU time cannot pass faster than the wall clock for one thread: look again once it could be spent.
        wait = min(remaining, max(cpu_left, 0.01)) if exit_fd is not None else 0.01
        readers = [fd for fd, capture in pipes.items() if not capture.closed]
        readers += [exit_fd] if exit_fd is not None else []
        writers = [stdin_w] if stdin_w >= 0 else []
        ready_r, ready_w, _ = select.select(readers, writers, [], wait)
        if ready_w:
            pending, stdin_w = _feed(stdin_w, pending)
        if any(pipes[fd].read(fd) for fd in ready_r if fd in pipes):
            status = "output_limit"
        exited = _poll_exit(pid)
    if exited is None:
        _kill_group(pid)
        exited = os.wait4(pid, 0)[1:]
    exit_status, usage = exited
    cpu = usage.ru_utime + usage.ru_stime
    _kill_leftovers(job["pid1"])  # now the pipes hold a finite amount: read what is left
    for fd, capture in pipes.items():
        os.set_blocking(fd, False)
        while not capture.closed and status is None:
            try:
                if capture.read(fd):
                    status = "output_limit"
            except BlockingIOError:
                break
    for fd in [*pipes, stdin_w, exit_fd]:
        if fd is not None and fd >= 0:
            os.close(fd)
    stdout, result, stderr = (bytes(pipes[fd].data) for fd in (out_r, res_r, err_r))
    status = status or ("timeout" if cpu > cpu_limit else _status_of(exit_status))
    return {"status": status, "stdout": stdout, "result": result, "stderr": stderr, "token": token, "cpu": cpu}


class _Capture:
    """Bytes read from one pipe, kept up to ``cap``; past it, stdout fails the test and stderr is cut."""

    def __init__(self, cap: int, fail_over_cap: bool) -> None:
        self.cap, self.fail_over_cap = cap, fail_over_cap
        self.data = bytearray()
        self.closed = False

    def read(self, fd: int) -> bool:
        """Read one chunk; True when this capture went over its cap and that fails the test."""
        chunk = os.read(fd, 65536)
        self.closed = not chunk
        self.data += chunk[: max(0, self.cap + 1 - len(self.data))]
        return self.fail_over_cap and len(self.data) > self.cap


def _exit_fd(pid: int) -> int | None:
    """A descriptor that turns readable when ``pid`` exits (Linux >= 5.3), else None and we poll every 10 ms."""
    if not _LINUX:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # kernel older than 5.3: polling is slower but equally correct
        return None


def _feed(stdin_w: int, pending: bytes) -> tuple[bytes, int]:
    try:
        written = os.write(stdin_w, pending[:65536])
    except (BlockingIOError, InterruptedError):
        return pending, stdin_w
    except BrokenPipeError:  # the program stopped reading its input: fine, it may not need all of it
        written = len(pending)
    pending = pending[written:]
    if not pending:
        os.close(stdin_w)
        return pending, -1
    return pending, stdin_w


def _poll_exit(pid: int) -> tuple[int, Any] | None:
    """``(exit status, resource usage)`` of ``pid`` once it exited, else None."""
    done, exit_status, usage = os.wait4(pid, os.WNOHANG)
    return (exit_status, usage) if done else None


_TICKS = os.sysconf("SC_CLK_TCK") if _LINUX else 100


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used so far, from ``/proc`` (0 where it cannot be read: then
    ``RLIMIT_CPU`` and the CPU time at exit decide)."""
    if not _LINUX:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _status_of(exit_status: int) -> str:
    if os.WIFSIGNALED(exit_status) and os.WTERMSIG(exit_status) in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout"  # the CPU-time rlimit (SIGXCPU, then SIGKILL at the hard limit)
    return "ok" if os.waitstatus_to_exitcode(exit_status) == 0 else "error"


def _child(
    job: dict[str, Any],
    test: dict[str, Any],
    workdir: str,
    uid: int | None,
    fds: tuple[int, ...],
    token: bytes | None,
    cpu_limit: float,
) -> None:
    """The forked child: confine itself, then run the program. Never returns."""
    exit_code = 1
    try:
        job["tests"].clear()  # our copy only: the program need not find the other tests' check sources
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(len(fds), 65536)
        _limit_child(job, cpu_limit, uid is not None)
        if uid is not None:
            for fd in range(len(fds)):  # our pipes, so that /dev/stdin and /dev/stdout can be reopened
                os.fchown(fd, uid, uid)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(workdir)
        os.umask(0o077)
        os.environ.update({"HOME": workdir, "TMPDIR": workdir})
        # Fresh text streams on the test's pipes (the harness's own objects may hold buffered data).
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.argv = ["solution.py"]
        exit_code = _execute(test, job["code"], job["prelude"], token)
    except BaseException:  # the program's own errors are reported on its stderr
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(exit_code)


def _limit_child(job: dict[str, Any], cpu_limit: float, limit_processes: bool) -> None:
    cpu = math.ceil(cpu_limit)  # SIGXCPU at the next whole second (the harness watches the fraction)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["max_file_bytes"], job["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limit_processes:  # per real uid: only meaningful once we run under a uid of our own
        resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"], job["max_processes"]))
    if _LINUX:
        prctl(_PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries cannot raise privileges again


def _execute(test: dict[str, Any], code: str, prelude: str, token: bytes | None) -> int:
    kind = test["kind"]
    if kind == "pytest":
        return run_pytest(test["source"], code, prelude, token)
    namespace: dict[str, Any] = {"__name__": "__main__" if kind == "stdio" else "solution"}
    namespace["__builtins__"] = builtins
    # Taken before the program runs, so that it cannot replace them (see the module docstring).
    check = compile(test["source"], "test.py", "exec") if kind == "code" else None
    builtins_dict, write, settrace, setprofile = vars(builtins), os.write, sys.settrace, sys.setprofile
    saved_builtins = dict(builtins_dict)
    try:
        if prelude:
            exec(compile(prelude, "prelude.py", "exec"), namespace)
        exec(compile(code, "solution.py", "exec"), namespace)
    except SystemExit as exit_:
        if kind != "stdio":
            raise
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    if kind == "call":
        solution = namespace.get("Solution")
        method = getattr(solution, test["fn_name"], None) if isinstance(solution, type) else None
        function = getattr(solution(), test["fn_name"]) if method is not None else namespace.get(test["fn_name"])
        if not callable(function):
            raise NameError(f"the program defines no function or Solution method {test['fn_name']!r}")
        result = function(*test["args"], **test["kwargs"])
        sys.stdout.flush()
        _write_all(3, json.dumps(result).encode())
    elif kind == "code":
        settrace(None)
        setprofile(None)
        builtins_dict.clear()  # the program's additions go too, not only its replacements
        builtins_dict.update(saved_builtins)
        namespace["__builtins__"] = builtins
        namespace["__name__"] = "__main__"  # the check runs as a script: its main guard must not skip it
        try:
            exec(check, namespace)
        except AssertionError:
            write(3, b"assertion")
            raise
        write(3, token)
    return 0


def _verdict(test: dict[str, Any], run: dict[str, Any], expected: Any) -> dict[str, Any]:
    verdict = {"status": run["status"], "stderr": run["stderr"][-300:].decode("utf-8", "replace")}
    if test["kind"] in _CHECKED and run["status"] in ("ok", "error"):
        if run["result"] == b"assertion":
            verdict["status"] = "wrong"
        elif run["status"] == "ok":  # exited 0: passed only if it got past the check to write the token
            verdict["status"] = "passed" if run["result"] == run["token"] else "error"
        return verdict
    if run["status"] != "ok":
        return verdict
    if test["kind"] == "stdio":
        passed = _lines(run["stdout"].decode("utf-8", "replace")) == _lines(expected)
    else:
        passed = _returned(run["result"], expected, test.get("or_first", False))
    verdict["status"] = "passed" if passed else "wrong"
    return verdict


def _returned(result: bytes, expected: Any, or_first: bool) -> bool:
    """Whether a call's JSON result equals ``expected`` (or its first item, with ``or_first``: TACO's lists)."""
    try:
        got = json.loads(result)
    except ValueError:
        return False
    first = or_first and isinstance(expected, list) and len(expected) > 0
    return _same(got, expected) or (first and _same(got, expected[0]))


def _lines(text: str) -> list[str]:
    """Whitespace-normalised output: each line stripped, blank lines at either end dropped."""
    return [line.strip() for line in text.strip().splitlines()]


def _same(got: Any, want: Any) -> bool:
    """Equality of JSON values, with floats equal up to 1e-6 relative / absolute."""
    if isinstance(want, float) or isinstance(got, float):
        both_numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (got, want))
        return both_numbers and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def _kill_group(pid: int) -> None:
    """Kill ``pid`` and its process group (the group may not exist yet if it is killed before its setsid)."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        with contextlib.suppress(ProcessLookupError):
            kill(target, signal.SIGKILL)


def _kill_leftovers(pid1: bool) -> None:
    """Kill and reap every process the test left behind."""
    if pid1:
        with contextlib.suppress(ProcessLookupError):  # raised when nothing was left
            os.kill(-1, signal.SIGKILL)  # from PID 1 of a PID namespace: everything else in the namespace
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
    for _ in range(100):  # as a subreaper: orphans are reparented to us; kill until none is left
        children = _children() if _LINUX else []
        for child in children:
            _kill_group(child)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not children:
            return
        time.sleep(0.005)


def _children() -> list[int]:
    me, children = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                children.append(int(entry))
    return children


def _read_message() -> dict[str, Any]:
    size = int.from_bytes(_read_exact(8), "big")
    return json.loads(_read_exact(size))


def _read_exact(size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise EOFError("the sandbox job ended early")
        data += chunk
    return bytes(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    main()
