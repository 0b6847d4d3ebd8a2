"""A rank that fails alone in a two-rank run (`klear.run.rank_failure`) stops every rank within seconds, and rank 0
names it: its error line and the summary say which rank failed and why, the report is written, the lock released,
no process is left, and only the failing rank prints a traceback. Each run fails in its first update."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from klear.run.rank_failure import Failure, RankFailures, boards, exit_message, watch_started_ranks
from tests.runs import RL_SHORT

pytestmark = pytest.mark.end_to_end  # two-rank runs of `python -m klear.fit`, and watched child processes

GRACE_S = 3.0
"""The runs' `klear.run.rank_failure.GRACE_S` (`tests.run.failing_rank`)."""
ARGS = [*RL_SHORT, "trainer.max_steps=2", "eval.every_n_steps=0", "trainer.devices=2", "trainer.strategy=fsdp2"]
ARGS += ["objective.name=tests.run.failing_rank:FailingPPO"]


def fit_failing(tmp_path: Path, how: str, rank: int = 1, extra: tuple[str, ...] = ()):
    """``python -m klear.fit`` on two ranks whose rank ``rank`` fails as ``how`` (`tests.run.failing_rank`), with
    the ``extra`` overrides: its exit status, stdout, stderr, output folder and seconds. Within 15 s of rank 0's exit
    no process of the run is left but a lingering rank and its own children (its reward workers), which outlive rank
    0 by design and are killed."""
    output = tmp_path / "rl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAIL_RANK": str(rank), "FAIL_HOW": how, "FAIL_GRACE_S": str(GRACE_S)}
    command = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", *ARGS, *extra, f"output_dir={output}"]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        started = time.monotonic()
        run = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            code = run.wait(timeout=180)  # without the watcher, a blocked rank 0 waits for gloo's 30-minute timeout
        finally:
            seconds = time.monotonic() - started
            left, stray = processes_left(run.pid, lingering=how == "linger")
            if left:
                os.killpg(run.pid, signal.SIGKILL)
    assert not stray, f"processes left: {stray}"
    assert bool(left) == (how == "linger"), f"processes left: {left}"
    return code, out.read_text(), err.read_text(), output, seconds


def processes_left(group: int, lingering: bool, wait_s: float = 15.0) -> tuple[dict[int, str], dict[int, str]]:
    """The processes of ``group`` alive once none is left (but, when ``lingering``, a lingering rank, a ``klear.fit``
    whose parent, rank 0, is gone, and its children), or ``wait_s`` seconds from now; and those of them that are
    neither (command lines by pid)."""
    end = time.monotonic() + wait_s
    while True:
        members = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if fields[0] != "Z" and int(fields[2]) == group:
                members[int(stat.parent.name)] = (int(fields[1]), command)
        ranks = {pid for pid, (_, command) in members.items() if "klear.fit" in command}
        stray = {pid: command for pid, (parent, command) in members.items() if pid not in ranks and parent not in ranks}
        if not (stray if lingering else members) or time.monotonic() >= end:
            return {pid: command for pid, (_, command) in members.items()}, stray
        time.sleep(0.1)


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def assert_ended(output: Path, status: str, stdout: str) -> None:
    assert stdout.splitlines()[0].startswith(f"run {status}: 0 steps in "), stdout
    assert stdout.splitlines()[-1].startswith("no checkpoint was completed: start again with: "), stdout
    assert (output / "report.md").is_file() and not (output / ".klear.lock").exists()
    assert f'"status": "{status}"' in (output / "summary.json").read_text()


def test_a_rank_that_fails_while_the_others_wait_for_it_ends_the_run_after_the_grace(tmp_path):
    """Rank 0 stays blocked in its collective (the failing rank holds its connections open, as with NCCL): its
    watcher ends the run GRACE_S after it learned of the failure, with the report and the summary; its reward workers
    end with it, quietly."""
    workers = ("reward.num_workers=2",)  # rank 0's end with them at once; rank 1's stay with it
    code, stdout, stderr, output, seconds = fit_failing(tmp_path, "linger", extra=workers)
    assert code == 1, stderr[-3000:]
    assert errors(stderr) == [
        "error: rank 1 failed at step 0: RuntimeError: boom on rank 1; every rank stopped (the traceback is in "
        "rank 1's output, its lines prefixed [rank1])"
    ]
    assert_ended(output, "failed at step 0: RuntimeError on rank 1: boom on rank 1", stdout)
    assert "[rank1]: RuntimeError: boom on rank 1" in stderr and "[rank0]" not in stderr
    assert "EOFError" not in stderr, stderr[-3000:]
    assert seconds < 120, seconds


def test_a_rank_killed_by_sigkill_is_named_and_no_process_is_killed_by_lightning(tmp_path):
    """Lightning's observer killed rank 0 with SIGKILL (exit -9, no summary); the rank's death is written instead,
    and rank 0's own collective error (a closed connection) is not reported as the run's."""
    code, stdout, stderr, output, _ = fit_failing(tmp_path, "kill")
    assert code == 1, stderr[-3000:]
    killed = f"rank 1 {exit_message(-signal.SIGKILL)}"
    assert errors(stderr) == [f"error: {killed}, so every rank stopped"]
    assert_ended(output, f"failed at step 0: {killed}", stdout)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("data.train: ") == 1  # rank 1's information lines repeat rank 0's: not printed


@pytest.mark.slow  # the default run keeps the two cases above and the launcher's watch below
def test_a_rank_that_cannot_start_ends_the_run_before_the_process_group_forms(tmp_path):
    """Rank 0 waits for rank 1 in the process group's rendezvous: Lightning's observer killed it with SIGKILL."""
    code, stdout, stderr, output, _ = fit_failing(tmp_path, "start")
    assert code == 1, stderr[-3000:]
    assert errors(stderr)[-1] == "error: rank 1 exited with status 2, so every rank stopped"
    assert any("rank 1 cannot start" in line for line in errors(stderr)[:-1]), stderr[-3000:]
    assert_ended(output, "failed at step 0: rank 1 exited with status 2", stdout)


@pytest.mark.slow  # the default run keeps the first two cases above
def test_rank_0_failing_reports_its_own_error_and_the_other_rank_prints_no_traceback(tmp_path):
    code, stdout, stderr, output, _ = fit_failing(tmp_path, "raise", rank=0)
    assert code == 1, stderr[-3000:]
    assert_ended(output, "failed at step 0: RuntimeError on rank 0: boom on rank 0", stdout)
    assert "[rank0]: RuntimeError: boom on rank 0" in stderr and "[rank1]: Traceback" not in stderr
    assert errors(stderr) == []


@pytest.mark.slow  # the lingering case covers the same report through the watcher
def test_rank_1_failing_is_reported_by_rank_0_when_its_collective_fails(tmp_path):
    code, stdout, stderr, output, _ = fit_failing(tmp_path, "raise")
    assert code == 1, stderr[-3000:]
    assert errors(stderr)[0].startswith("error: rank 1 failed at step 0: RuntimeError: boom on rank 1; ")
    assert_ended(output, "failed at step 0: RuntimeError on rank 1: boom on rank 1", stdout)
    assert "[rank0]" not in stderr


@pytest.mark.slow  # one process runs out of memory in the default run (`test_out_of_memory`)
def test_rank_1_out_of_memory_is_its_own_line_and_rank_0_names_it(tmp_path):
    code, stdout, stderr, output, _ = fit_failing(tmp_path, "allocate")
    assert code == 1, stderr[-3000:]
    where = "out of memory in a forward and backward pass"
    own = [line for line in errors(stderr) if line.startswith("error: rank 1: ")]  # the ranks print in any order
    assert len(own) == 1 and own[0].startswith(f"error: rank 1: {where} at step 0 (could not allocate 909.5 TiB): ")
    assert [line for line in errors(stderr) if line not in own] == [
        f"error: rank 1 failed at step 0: {where} (could not allocate 909.5 TiB); every rank stopped (rank 1's own "
        "error line says what to change)"
    ]
    assert_ended(output, f"failed at step 0: {where} (could not allocate 909.5 TiB) on rank 1", stdout)
    assert "Traceback" not in stderr, stderr[-3000:]


def test_the_launcher_s_ranks_that_end_badly_are_written_and_none_is_killed(monkeypatch):
    """`watch_started_ranks`, Lightning's observer's replacement, on node 1 of a job of five ranks per node (ranks
    5 to 9): the kill of the last child, after the test, is reported too."""
    zero = RankFailures(lambda failure: None, threading.Lock())
    zero.store = dist.HashStore()
    zero.open()
    monkeypatch.setenv("NODE_RANK", "1")
    exits = ["pass", "raise SystemExit(3)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    children = [subprocess.Popen([sys.executable, "-c", code]) for code in exits]
    children.append(subprocess.Popen(["sleep", "60"]))
    watcher = None
    try:
        watcher = watch_started_ranks(children)
        end = time.monotonic() + 30
        while len(zero._read()) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        written = sorted(zero._read(), key=lambda failure: failure.rank)
        assert written == [Failure(7, "exited", "exited with status 3"), Failure(8, "exited", exit_message(-9))]
        time.sleep(1.0)
        assert children[-1].poll() is None and len(zero._read()) == 2  # nothing killed, nothing more written
    finally:
        children[-1].kill()
        if watcher is not None:
            watcher.join(timeout=10)  # it reports the kill, to this board only
        zero.close()
    assert not watcher.is_alive() and zero not in boards
    assert zero._read()[-1] == Failure(9, "exited", exit_message(-9))
