"""Ctrl-C and SIGTERM to the commands other than ``klear.fit`` (whose stops are tests/run/test_stopping.py and
test_loading_stop.py): each stops with one line and exit status 130 or 143, its outputs whole or as they were, its
locks released, no process of its own left running, and what can continue does, with the same command."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klear.run.loading_stop import EXIT_INTERRUPTED, EXIT_SIGTERM
from tests.test_user_errors import klear

pytestmark = pytest.mark.end_to_end  # signals commands started in subprocesses

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def start(args: list[str], log: Path) -> subprocess.Popen:
    """``python -m ARGS`` in a session of its own (as a terminal's job or a scheduler's), its stderr in ``log``."""
    with log.open("w") as stderr:
        command = [sys.executable, "-m", *args]
        return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)


def wait_until(ready, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        assert process.poll() is None, f"the command ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in 300 s"
        time.sleep(0.05)


def ended(process: subprocess.Popen, log: Path) -> tuple[str, list[str]]:
    """The command's stdout and stderr lines once it and every process of its session are gone (zombies waiting
    for init aside)."""
    stdout, _ = process.communicate(timeout=120)
    deadline = time.monotonic() + 30
    while (alive := session_processes(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"processes of the command still running: {alive}"
    text = log.read_text()
    assert "Traceback" not in text + stdout.decode(), text[-3000:]
    return stdout.decode(), text.splitlines()


def session_processes(session: int) -> list[str]:
    """The command lines of the live (not zombie) processes of ``session``."""
    return [command for fields, command in live_processes() if int(fields[3]) == session]


def live_processes() -> list[tuple[list[str], str]]:
    """``(stat fields after the name, command line)`` of each live (not zombie) process."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                found.append((fields, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_sigterm_stops_synthetic_with_no_output_and_no_lock(tmp_path):
    out = tmp_path / "big.jsonl"
    args = ["klear.data", "synthetic", "--task", "math", "--num", "10000000", "--out", str(out)]
    process = start(args, tmp_path / "e")
    lock = tmp_path / ".big.jsonl.klear.lock"
    wait_until(lock.exists, process, "lock on the output")
    process.send_signal(signal.SIGTERM)  # `kill PID`: the command alone
    _, lines = ended(process, tmp_path / "e")
    assert process.returncode == EXIT_SIGTERM
    assert lines == ["stopped (SIGTERM): no output written"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["e"]  # no output, no temporary file, no lock


def test_ctrl_c_stops_a_code_evaluation_and_its_reward_workers(tmp_path):
    data = tmp_path / "code.jsonl"
    assert klear("klear.data", "synthetic", "--task", "code", "--num", "200", "--out", str(data)).returncode == 0
    output = tmp_path / "eval"
    args = ["klear.eval", "--model", "tiny-sft-code", "--data", str(data), "--k", "8", "--max-new-tokens", "96"]
    process = start([*args, "--num-workers", "2", "--output", str(output)], tmp_path / "e")
    wait_until(lambda: "scoring them part by part" in (tmp_path / "e").read_text(), process, "sampling")
    time.sleep(2)  # the reward workers are scoring
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the job
    _, lines = ended(process, tmp_path / "e")
    assert process.returncode == EXIT_INTERRUPTED
    assert lines[-1] == "eval interrupted (Ctrl-C): nothing written"
    assert not output.exists()


def test_sigterm_stops_an_evaluation_that_resume_finishes_as_if_never_stopped(tmp_path):
    """SIGTERM (a scheduler's) to ``klear.eval`` of two sets, once the second's first chunks are on disk: the first
    set's results are written, the second's samples so far kept; ``--resume`` leaves the first as it is and samples
    only the rest of the second, whose results are a run's never stopped, bit for bit."""
    data = tmp_path / "eval.jsonl"
    assert klear("klear.data", "synthetic", "--split", "eval", "--num", "40", "--out", str(data)).returncode == 0
    rows = data.read_text().splitlines(keepends=True)
    (tmp_path / "small.jsonl").write_text("".join(rows[:8]))
    model = ["--model", "tiny-sft", "--k", "4", "--max-new-tokens", "96", "--batch-size", "16", "--chunk", "4"]
    sets = ["--data", f"small={tmp_path / 'small.jsonl'}", f"big={data}"]  # the big set in 10 chunks of 4
    output = tmp_path / "eval"
    process = start(["klear.eval", *model, *sets, "--output", str(output)], tmp_path / "e")
    partial = output / "big" / "partial.jsonl"
    wait_until(lambda: partial.exists() and partial.read_text().count("\n") >= 9, process, "two chunks kept")
    process.send_signal(signal.SIGTERM)
    _, lines = ended(process, tmp_path / "e")
    assert process.returncode == EXIT_SIGTERM
    kept = partial.read_text().count("\n") - 1  # the settings line aside
    assert 8 <= kept < 40 and kept % 4 == 0  # whole chunks
    small = [output / "small" / name for name in ("results.jsonl", "summary.json", "summary.md")]
    assert lines[-1] == (
        f"eval stopped (SIGTERM): {', '.join(map(str, small))} written; kept {kept} of 40 problems' samples in "
        f"{partial}: the same command with --resume goes on from them"
    )
    before = [path.read_bytes() for path in small]
    refused = klear("klear.eval", *model, *sets, "--output", str(output))
    assert refused.returncode == 2 and "already holds results" in refused.stderr

    resumed = klear("klear.eval", *model, *sets, "--output", str(output), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{output / 'small'} holds this command's results already: not sampled again" in resumed.stdout
    assert f"sampling {40 - kept} problems x 4" in resumed.stderr and f"{kept} problems read back" in resumed.stdout
    assert [path.read_bytes() for path in small] == before and not partial.exists()
    alone = klear("klear.eval", *model, "--data", str(data), "--output", str(tmp_path / "alone"))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert (output / "big" / "results.jsonl").read_bytes() == (tmp_path / "alone" / "results.jsonl").read_bytes()
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in (output / "big", tmp_path / "alone")]
    assert (summaries[0]["resumed"], summaries[1]["resumed"]) == (kept, 0)
    assert summaries[0]["avg@k"] == summaries[1]["avg@k"] and summaries[0]["maj@k"] == summaries[1]["maj@k"]


def test_sigterm_while_vllm_samples_stops_an_evaluation_with_its_line_and_what_it_kept(tmp_path):
    """SIGTERM to ``klear.eval --engine vllm`` as its engine steps (vLLM in the command's process) and its reward
    workers score what ended: the stream's requests are aborted and the scoring ended without replacing the stop,
    which ends in its one line and exit status, with the parts already scored kept for ``--resume``."""
    pytest.importorskip("vllm")
    data = tmp_path / "eval.jsonl"
    assert klear("klear.data", "synthetic", "--split", "eval", "--num", "60", "--out", str(data)).returncode == 0
    output = tmp_path / "eval"
    args = ["klear.eval", "--model", "tiny-sft", "--data", str(data), "--engine", "vllm", "--k", "8"]
    args += ["--max-new-tokens", "96", "--chunk", "1", "--num-workers", "2", "--overlap-scoring"]
    args += ["--batch-size", "16"]  # two problems' samples at a time: the stream is far from its end at the stop
    args += ["--output", str(output)]
    process = start(args, tmp_path / "e")
    partial = output / "partial.jsonl"
    wait_until(lambda: partial.exists() and partial.read_text().count("\n") >= 2, process, "a part kept")
    process.send_signal(signal.SIGTERM)
    stdout, lines = ended(process, tmp_path / "e")
    assert process.returncode == EXIT_SIGTERM
    vllm_log = re.compile(r"^(\(\w+ pid=\d+\) )?(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[")  # vLLM's format
    assert not any(vllm_log.match(line) for line in stdout.splitlines()), stdout[-2000:]
    assert any(vllm_log.match(line) for line in lines)  # its start-up lines, on stderr with klear's
    kept = partial.read_text().count("\n") - 1
    assert 1 <= kept < 60
    assert lines[-1] == (
        f"eval stopped (SIGTERM): nothing written; kept {kept} of 60 problems' samples in {partial}: the same "
        "command with --resume goes on from them"
    )


def test_sigterm_stops_a_comparison_whose_rerun_resumes_it(tmp_path):
    """SIGTERM to ``klear.compare`` alone (``kill PID``) reaches the run in progress once: it stops at a step with
    its checkpoint, and the same command resumes it from there."""
    output = tmp_path / "cmp"
    args = ["klear.compare", "--config", "configs/rl.yaml", "--objectives", "gppo", "--seeds", "0"]
    args += [f"output_dir={output}", "trainer.max_steps=40", "trainer.checkpoint_every_n_steps=1"]
    args += ["eval.every_n_steps=0", "eval.num_prompts=8"]  # the evaluations before and after: 8 problems, not 200
    run = output / "runs" / "gppo-seed0"
    process = start(args, tmp_path / "e")
    wait_until(lambda: any(run.glob("checkpoints/step-*.ckpt")), process, "checkpoint")
    process.send_signal(signal.SIGTERM)
    stdout, lines = ended(process, tmp_path / "e")
    assert process.returncode == EXIT_SIGTERM
    assert lines[-1] == (
        "compare stopped (SIGTERM): 0 of 1 runs finished; the same command continues (finished runs are skipped, "
        "the others resume from their last checkpoint)"
    )
    assert stdout.splitlines()[-1] == f"stopped gppo seed 0 (exit {EXIT_SIGTERM}); see {run / 'log.txt'}"
    log = (run / "log.txt").read_text()
    assert log.count("warning: SIGTERM received") == 1 and "run stopped at step " in log
    checkpoint = max(run.glob("checkpoints/step-*.ckpt"))
    assert not (output / ".klear.lock").exists() and not (run / ".klear.lock").exists()

    steps = int(checkpoint.stem.removeprefix("step-")) + 1
    rerun = klear(*[arg.replace("max_steps=40", f"max_steps={steps}") for arg in args])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    said = rerun.stdout.splitlines()
    assert said[0] == "resume gppo seed 0" and said[1].startswith("done gppo seed 0 in "), rerun.stdout
    assert f"Restored all states from the checkpoint at {checkpoint}" in (run / "log.txt").read_text()


@pytest.mark.slow  # the default run keeps SIGTERM to the comparison, which stops its run the same way
def test_a_comparison_killed_outright_stops_its_run_at_a_step(tmp_path):
    """``kill -9`` of ``klear.compare`` (or its terminal closed): the kernel sends its run SIGTERM, and the run stops
    at a step with its checkpoint, as after a SIGTERM to the comparison."""
    output = tmp_path / "cmp"
    args = ["klear.compare", "--config", "configs/rl.yaml", "--objectives", "ppo", "--seeds", "0"]
    args += [f"output_dir={output}", "trainer.max_steps=200", "trainer.checkpoint_every_n_steps=1"]
    args += ["eval.num_prompts=8"]  # the evaluation before the first step: 8 problems, not 200
    run = output / "runs" / "ppo-seed0"
    process = start(args, tmp_path / "e")
    wait_until(lambda: any(run.glob("checkpoints/step-*.ckpt")), process, "checkpoint")
    process.kill()
    process.wait(timeout=60)
    deadline = time.monotonic() + 120
    while any(f"output_dir={run} " in command for _, command in live_processes()):
        assert time.monotonic() < deadline, "the run outlived its comparison by 120 s"
        time.sleep(0.1)
    log = (run / "log.txt").read_text()
    assert "warning: SIGTERM received" in log and "run stopped at step " in log, log[-3000:]
    assert "nothing is lost: " in log and "Traceback" not in log
