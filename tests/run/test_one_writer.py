"""One writer per output, through the real commands in subprocesses: two ``klear.fit`` started together in one
``output_dir`` (one runs, the other is refused naming it), ``--resume`` and ``--overwrite`` against a live run
(refused, not a file touched), a holder killed with ``kill -9`` (the next start takes over its stale lock and says
so), the same for ``klear.compare`` and a ``klear.data`` command; and the folder messages: a run killed before its
first complete checkpoint (``--resume`` and a plain start give the same advice, which works) and a start refused
by the model-context check (the folder left as it was found).

A live holder is frozen with SIGSTOP while the second command tries, so that its files can be compared before and
after: it keeps its lock (the process exists) and writes nothing meanwhile."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems
from tests.compare.test_compare import SHORT as COMPARE_SHORT
from tests.run.test_resume_checks import fake_run
from tests.runs import RL_SHORT, read_metrics
from tests.test_user_errors import RL_QUICK, klear, one_line_error

pytestmark = pytest.mark.end_to_end  # runs two commands on one output in subprocesses, and kills one

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
FIT = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", *RL_SHORT]
HOST = socket.gethostname()


def files(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its content digest and modification time."""
    return {
        str(path.relative_to(root)): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def wait_for(condition, process: subprocess.Popen, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the holder ended (exit {process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.05)


def holder_record(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return None


def refusal(what: str, command: str, pid: int, lock: Path, elsewhere: str) -> str:
    """The one line a command held off by ``pid`` prints (its start time aside)."""
    record = holder_record(lock)
    assert record is not None and record["pid"] == pid, record
    return (
        f"error: {what} is held by {command}, pid {pid} on host {HOST} since {record['started']} (lock file {lock}): "
        f"wait for it to end, or {elsewhere}"
    )


def test_two_fits_started_together_one_runs_and_the_other_names_it(tmp_path):
    out = tmp_path / "run"
    command = [*FIT, "trainer.max_steps=6", f"output_dir={out}"]
    both = [subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [process.communicate(timeout=600)[1] for process in both]
    codes = sorted(process.returncode for process in both)
    assert codes == [0, 2], errors
    winner, loser = (0, 1) if both[0].returncode == 0 else (1, 0)
    lines = [line for line in errors[loser].splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in errors[loser], errors[loser]
    assert lines[0].startswith(
        f"error: output_dir '{out}' is held by klear.fit, pid {both[winner].pid} on host {HOST} since "
    )
    assert lines[0].endswith(f" (lock file {out / '.klear.lock'}): wait for it to end, or set output_dir=...")
    assert [row["step"] for row in read_metrics(out / "metrics.csv")] == [str(step) for step in range(7)]
    assert not (out / ".klear.lock").exists()  # released at the end of the run


@pytest.mark.slow  # the default run keeps two fits started together; test_folder_lock.py the takeover of a stale hold
def test_resume_and_overwrite_of_a_live_run_are_refused_then_a_killed_holder_is_taken_over(tmp_path):
    out = tmp_path / "run"
    args = [*FIT, f"output_dir={out}"]
    live = subprocess.Popen([*args, "trainer.max_steps=100000"], env=ENV, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(out.glob("checkpoints/step-*.ckpt")), live, "checkpoint")
        live.send_signal(signal.SIGSTOP)
        lock = out / ".klear.lock"
        expected = refusal(f"output_dir '{out}'", "klear.fit", live.pid, lock, "set output_dir=...")
        before = files(out)
        for option in ("--resume", "--overwrite"):
            assert one_line_error(klear(*args[2:], "trainer.max_steps=100000", option, env=ENV)) == expected, option
        assert files(out) == before  # not a file written, replaced or removed
    finally:
        live.kill()  # kill -9, also of a stopped process
        live.wait()
    step = int(next(out.glob("checkpoints/step-*.ckpt")).stem.removeprefix("step-"))
    result = klear(*args[2:], f"trainer.max_steps={step + 1}", "--resume", env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"output_dir '{out}': took over the stale hold of klear.fit, pid {live.pid} on host {HOST} since "
        in result.stderr
    )
    assert "which ended without releasing it" in result.stderr
    assert [row["step"] for row in read_metrics(out / "metrics.csv")] == [str(s) for s in range(step + 2)]
    assert not (out / ".klear.lock").exists()


@pytest.mark.slow  # the default run keeps two fits started together and the other refusals of a fit
def test_a_run_killed_before_its_first_checkpoint_is_told_one_thing_that_works(tmp_path):
    """What ``kill -9`` during the first save leaves: the run's files and a temporary checkpoint, no complete one.
    ``--resume`` and a plain start both advise ``--overwrite``, which then runs."""
    run = fake_run(tmp_path / "run", [2])
    complete = run.checkpoint(2)
    complete.with_suffix(".tmp").write_bytes(complete.read_bytes()[:100])  # the save cut short, not yet renamed
    complete.unlink()
    before = files(run.root)
    base = ["klear.fit", "--config", "configs/rl.yaml", *RL_QUICK, f"output_dir={run.root}"]
    assert one_line_error(klear(*base, "--resume")) == (
        f"error: --resume: no complete checkpoint in {run.checkpoints}: the run stopped before its first one was "
        "saved, so nothing can be resumed; start it again with --overwrite, or set output_dir=..."
    )
    assert one_line_error(klear(*base)) == (
        f"error: output_dir '{run.root}' holds a run that stopped before its first complete checkpoint, so nothing "
        "can be resumed; start it again with --overwrite, or set output_dir=..."
    )
    assert files(run.root) == before
    result = klear(*base, "--overwrite", env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in read_metrics(run.metrics)] == ["0", "1", "2"]


@pytest.mark.slow  # the default run keeps the other refusals of a fit
def test_a_start_refused_by_the_model_context_leaves_the_folder_as_it_found_it(tmp_path):
    too_long = "rollout.max_new_tokens=100000"
    message = "error: rollout.max_new_tokens = 100000: 100000 new tokens leave no room for a prompt in the model's"
    new = tmp_path / "new" / "run"
    assert one_line_error(klear(*FIT[2:], too_long, f"output_dir={new}")).startswith(message)
    assert not (tmp_path / "new").exists()  # the folders it made are gone
    old = fake_run(tmp_path / "old", [4])
    before = files(old.root)
    assert one_line_error(klear(*FIT[2:], too_long, f"output_dir={old.root}", "--overwrite")).startswith(message)
    assert files(old.root) == before  # --overwrite replaced nothing: the start was refused


@pytest.mark.slow  # the same lock as a fit's, which the default run checks
def test_a_second_comparison_in_one_output_dir_is_refused_and_a_killed_one_taken_over(tmp_path):
    out = tmp_path / "compare"
    args = ["--config", "configs/rl.yaml", "--objectives", "ppo", *COMPARE_SHORT, f"output_dir={out}"]
    command = [sys.executable, "-m", "klear.compare", *args]
    live = subprocess.Popen(
        [*command, "--seeds", "0", "trainer.max_steps=100000"], env=ENV, stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    lock = out / ".klear.lock"
    try:
        wait_for(lambda: (out / "runs" / "ppo-seed0" / ".klear.lock").is_file(), live, "run started")
        os.killpg(live.pid, signal.SIGSTOP)  # the comparison and its run
        expected = refusal(f"output_dir '{out}'", "klear.compare", live.pid, lock, "set output_dir=...")
        before = files(out)
        assert one_line_error(klear("klear.compare", *args, "--seeds", "0", env=ENV)) == expected
        assert files(out) == before
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait()
    result = klear("klear.compare", *args, "--seeds", "1", "trainer.max_steps=2", env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"output_dir '{out}': took over the stale hold of klear.compare, pid {live.pid} on host" in result.stderr
    assert (out / "comparison.csv").is_file() and not lock.exists()


@pytest.mark.slow  # the same lock as a fit's, which the default run checks
def test_a_data_command_writing_the_same_output_is_refused_and_a_killed_one_taken_over(tmp_path):
    data = write_jsonl(generate_problems(4, split="train", seed=0, levels=[1]), tmp_path / "p.jsonl")
    out = tmp_path / "curated"
    curate = [
        "klear.data",
        "curate",
        "--model",
        "tiny-sft",
        "--band",
        "[0, 1]",
        "--k",
        "2",
        "--max-new-tokens",
        "16",
        "--chunk",
        "1",
    ]
    curate += ["--data", str(data), "--out", str(out)]
    live = subprocess.Popen([sys.executable, "-m", *curate], env=ENV, stderr=subprocess.DEVNULL)
    lock = out / ".results.jsonl.klear.lock"
    try:
        wait_for(lambda: holder_record(lock) is not None, live, "lock record")
        live.send_signal(signal.SIGSTOP)
        expected = refusal(
            f"--out {out / 'results.jsonl'}", "klear.data curate", live.pid, lock, "write --out elsewhere"
        )
        before = files(out)
        assert one_line_error(klear(*curate, env=ENV)) == expected
        assert files(out) == before
    finally:
        live.kill()
        live.wait()
    result = klear(*curate, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"took over the stale hold of klear.data curate, pid {live.pid} on host {HOST}" in result.stderr
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    assert not list(out.glob(".*.klear.lock"))
