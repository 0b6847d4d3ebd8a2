"""klear's CPU thread policy (`klear.runtime.threads`): the environment wins, then a caller's own count, then the
requested one, else the free cores capped by the model's size; the cgroup quota caps the cores; bad values stop
the commands with one line before torch is imported."""

import logging
import os
import subprocess
import sys

import pytest
import torch

from klear.runtime import threads
from tests.test_user_errors import klear, one_line_error

pytestmark = pytest.mark.end_to_end  # starts a busy process and the commands in subprocesses


@pytest.fixture
def fresh(monkeypatch):
    """No OMP_NUM_THREADS, torch at its start-up count, and no earlier choice; torch's count restored after."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.HANDED_DOWN, raising=False)
    monkeypatch.setitem(threads._state, "request", None)
    monkeypatch.setitem(threads._state, "applied", None)
    monkeypatch.setitem(threads._state, "choice", None)
    torch.set_num_threads(threads.startup_threads())
    yield
    torch.set_num_threads(before)


def test_the_environment_wins_and_the_line_says_the_request_is_ignored(fresh, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    choice = threads.choose(2, 10**9)
    assert choice.threads == 1
    assert choice.reason == "OMP_NUM_THREADS=1 set in the environment; the requested 2 is ignored"
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS must be a whole number >= 1, got 'two'"):
        threads.choose(0, 10**6)


def test_a_request_is_used_as_given_and_a_callers_own_count_is_kept(fresh):
    assert (threads.choose(3, 10**6).threads, threads.choose(3, 10**6).reason) == (3, "as requested")
    torch.set_num_threads(threads.startup_threads() + 3)  # what a Python caller set before calling klear
    choice = threads.choose(2, 10**6)
    assert choice.threads == threads.startup_threads() + 3
    assert choice.reason == "set by torch.set_num_threads before; the requested 2 is ignored"
    with pytest.raises(ValueError, match="CPU threads must be >= 0"):
        threads.choose(-1, 10**6)


def test_auto_takes_the_free_cores_at_most_what_the_model_size_allows(fresh, monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 2.6)
    assert threads.choose(0, 10**8).threads == 5  # 8 - 2.6, rounded
    assert threads.choose(0, 430_000).threads == 4  # the tiny model: one thread per 100K parameters
    assert threads.choose(0, 1_000).threads == 2  # never capped below 2
    monkeypatch.setattr(threads, "busy_cores", lambda: 7.9)
    choice = threads.choose(0, 10**8)
    assert choice.threads == 1
    assert (
        choice.line() == "CPU threads: 1 of 8 cores (auto: 7.9 of them busy with other processes, 100.00M parameters)"
    )


def test_configure_applies_logs_once_and_a_share_stands(fresh, caplog):
    with caplog.at_level(logging.INFO, logger="klear.runtime.threads"):
        assert threads.configure(1, 10**6).threads == 1
        assert threads.configure(1, 10**6) is None  # the same request again: kept, not logged
    assert torch.get_num_threads() == 1
    [record] = caplog.records
    assert record.getMessage().startswith("CPU threads: 1 of ")
    threads.share(2, 2, "a worker's half")
    assert threads.configure(0, 10**6) is None  # a rollout worker loading its model keeps its share
    assert torch.get_num_threads() == 2


def test_the_ranks_of_a_multi_process_run_share_the_cores_and_use_the_count_logged(fresh, monkeypatch, caplog):
    """The process that starts the ranks divides the free cores among them and hands its count down through
    ``OMP_NUM_THREADS`` (which Lightning's launcher would otherwise set after klear's line); a rank started with
    it logs the same count and says whose choice it is, and `current` is what the report records."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 2.0)
    assert threads.current() is None
    with caplog.at_level(logging.INFO, logger="klear.runtime.threads"):
        choice = threads.configure(0, 10**8, processes=2)
    assert choice.threads == 3 and choice.reason.endswith(", 2 processes of this run")  # (8 - 2) / 2
    assert torch.get_num_threads() == 3 and caplog.records[0].getMessage().startswith(choice.line())
    assert threads.current() == choice and threads.recorded() == {"threads": 3, "cores": 8, "reason": choice.reason}
    assert (threads.os.environ["OMP_NUM_THREADS"], threads.os.environ[threads.HANDED_DOWN]) == (
        "3",
        f"3 {choice.reason}",
    )
    rank = threads.choose(0, 10**8, processes=2)  # what a started rank decides from the environment it inherits
    assert (rank.threads, rank.reason) == (3, f"chosen by the process that started this rank: {choice.reason}")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # a user's own count is theirs, not klear's
    assert threads.choose(0, 10**8, processes=2).reason == "OMP_NUM_THREADS=5 set in the environment"


def test_a_users_own_mkl_cbwr_is_kept():
    env = {**os.environ, "MKL_CBWR": "COMPATIBLE"}
    code = "import os, klear; print(os.environ['MKL_CBWR'])"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "COMPATIBLE"


def test_a_single_process_run_leaves_the_environment_alone(fresh):
    threads.configure(1, 10**6)
    assert "OMP_NUM_THREADS" not in threads.os.environ and threads.HANDED_DOWN not in threads.os.environ


def test_busy_cores_sees_a_busy_process_and_not_this_one(fresh):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        threads.busy_cores(0.3)  # let the loop start
        others = threads.busy_cores(0.3)
        own_start = threads.busy_cores(0.0001)
    finally:
        busy.kill()
        busy.wait()
    assert others >= 0.5  # the loop takes about a core
    assert 0.0 <= own_start <= threads.startup_threads()


def test_the_cgroup_quota_caps_the_cores(fresh, monkeypatch, tmp_path):
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(threads, "CGROUP_V2", cpu_max)
    cpu_max.write_text("max 100000\n")
    assert threads.cgroup_quota() is None
    assert threads.usable_cores() == threads.startup_threads()
    cpu_max.write_text("50000 100000\n")
    assert threads.cgroup_quota() == 0.5
    assert threads.usable_cores() == 1
    monkeypatch.setattr(threads, "CGROUP_V2", tmp_path / "absent")
    quota, period = tmp_path / "quota", tmp_path / "period"
    quota.write_text("150000\n")
    period.write_text("100000\n")
    monkeypatch.setattr(threads, "CGROUP_V1", (quota, period))
    assert threads.cgroup_quota() == 1.5


def test_bad_thread_counts_stop_each_command_with_one_line(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    fit = one_line_error(klear("klear.fit", "--config", "configs/rl.yaml", "trainer.cpu_threads=-1"))
    assert "trainer.cpu_threads = -1 is not accepted" in fit
    evaluated = one_line_error(klear("klear.eval", "--model", "tiny", "--data", str(data), "--threads", "-1"))
    assert evaluated == "error: --threads must be in [0, 4096] (0: chosen by klear), got -1"
