"""SIGTERM, as cluster schedulers send it to every process of a job: each rank stops at the same step boundary
within seconds, rank 0 prints the summary with the resume command, the exit status is 143, the last checkpoint is
complete, and ``--resume`` continues. A rank that cannot reach the boundary exits after the grace period."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from klear.run.directory import checkpoint_problem
from klear.run.loading_stop import EXIT_SIGTERM
from klear.run.stopping import SignalStop
from tests.runs import RL_SHORT, fit_in_subprocess, read_metrics

pytestmark = pytest.mark.end_to_end  # stops real runs started in subprocesses

LONG = [*RL_SHORT, "trainer.max_steps=200", "trainer.checkpoint_every_n_steps=1"]
"""A run far longer than the test, with a checkpoint every step."""


def start(args: list[str]) -> subprocess.Popen:
    """``python -m klear.fit ARGS`` as a scheduler's job: a process group of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "klear.fit", *args]
    return subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(output: Path, rows: int, process: subprocess.Popen) -> None:
    """Until the run wrote a checkpoint and ``rows`` rows of metrics."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        metrics = output / "metrics.csv"
        if list(output.glob("checkpoints/step-*.ckpt")) and metrics.is_file() and len(read_metrics(metrics)) >= rows:
            return
        time.sleep(0.1)
    raise AssertionError(f"the run ended before {rows} rows: {process.returncode}")


def group_members(group: int) -> list[int]:
    """Live processes (zombies aside) of the process group ``group``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found


def stop_group(process: subprocess.Popen, within: float) -> tuple[str, str]:
    """SIGTERM to the whole group; the output once every process of it is gone, which must take under ``within``."""
    os.killpg(process.pid, signal.SIGTERM)
    signalled = time.monotonic()
    stdout, stderr = process.communicate(timeout=within)
    while group_members(process.pid) and time.monotonic() < signalled + within:
        time.sleep(0.1)
    assert not group_members(process.pid), "a process of the run outlived it"
    return stdout.decode(), stderr.decode()


def assert_stopped(output: Path, args: list[str], stdout: str, stderr: str, returncode: int) -> Path:
    assert returncode == EXIT_SIGTERM, stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    assert "warning: SIGTERM received: stopping at the end of the step in progress, which is saved, or within" in stderr
    summary = stdout.splitlines()
    assert summary[0].startswith("run stopped at step ") and summary[0].split(": ")[1] == "SIGTERM", summary
    checkpoint = sorted(output.glob("checkpoints/step-*.ckpt"))[-1]
    assert (
        summary[-1]
        == f"nothing is lost: {checkpoint} is kept; resume with: python -m klear.fit {' '.join(args)} --resume"
    )
    assert not list(output.glob("checkpoints/*.tmp"))
    assert checkpoint_problem(checkpoint) is None
    state = torch.load(checkpoint, weights_only=False, map_location="cpu")
    assert state["state_dict"] and state["optimizer_states"] and state["loops"]["fit_loop"]
    assert "**Status:** stopped at step " in (output / "report.md").read_text()
    return checkpoint


@pytest.mark.slow  # the default run keeps SIGTERM's stop of SFT in an evaluation (below) and of two RL ranks
def test_sigterm_stops_one_process_at_a_step_with_the_summary(tmp_path):
    output = tmp_path / "rl"
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *LONG]
    process = start(args)
    wait_for(output, rows=2, process=process)
    stdout, stderr = stop_group(process, within=30)
    assert_stopped(output, args, stdout, stderr, process.returncode)


@pytest.mark.slow  # the default run keeps SFT's stop in an evaluation, the saved step and resume after Ctrl-C
# (tests/test_console.py) and SFT's exact resume (tests/stages/test_sft_end_to_end.py)
def test_sigterm_between_steps_saves_the_step_and_the_resume_repeats_the_run_exactly(tmp_path):
    """SFT, whose steps have no agreement point inside: the stop is agreed at the end of the step the signal came in,
    which is saved first although no checkpoint was due (every 400 steps), so no step is lost, and the resumed run's
    rows are those of a run that was never stopped, bit for bit."""
    short = ["data.num_train=800", "trainer.max_steps=30", "trainer.checkpoint_every_n_steps=400"]
    short += ["trainer.progress_bar=false", "eval.every_n_steps=0", "eval.num_prompts=4", "eval.max_new_tokens=8"]
    whole, output = tmp_path / "whole", tmp_path / "stopped"
    fit_in_subprocess(["--config", "configs/sft.yaml", f"output_dir={whole}", *short])
    args = ["--config", "configs/sft.yaml", f"output_dir={output}", *short]
    process = start(args)
    deadline = time.monotonic() + 300
    while not ((output / "metrics.csv").is_file() and len(read_metrics(output / "metrics.csv")) >= 5):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before 5 rows"
        time.sleep(0.05)
    stdout, stderr = stop_group(process, within=30)
    checkpoint = assert_stopped(output, args, stdout, stderr, process.returncode)
    steps = int(checkpoint.stem.removeprefix("step-"))
    assert 5 <= steps < 30 and len(read_metrics(output / "metrics.csv")) == steps  # every step it logged is saved
    fit_in_subprocess([*args, "--resume"])
    exact = ("step", "train/loss", "train/grad_norm", "train/lr", "train/tokens")
    rows = [{key: row[key] for key in exact} for row in read_metrics(output / "metrics.csv")]
    assert rows == [{key: row[key] for key in exact} for row in read_metrics(whole / "metrics.csv")]
    assert (output / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()  # steps 0 and 30


def resume_one_step(args: list[str], steps: int) -> None:
    """``--resume`` of a stopped run of ``args`` to ``trainer.max_steps=steps``: it runs the one step left."""
    again = [*(arg for arg in args if arg != "trainer.max_steps=200"), f"trainer.max_steps={steps}", "--resume"]
    resumed = subprocess.run(
        [sys.executable, "-m", "klear.fit", *again],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.splitlines()[0].startswith("run finished: 1 step in ")


@pytest.mark.slow  # two ranks and a resume; the default run keeps two ranks inside a step, one in an evaluation
def test_sigterm_to_two_ranks_during_an_evaluation_stops_both_and_resumes(tmp_path):
    """The case that hung: SIGTERM to the job's process group while the ranks evaluate (a gather of results)."""
    output = tmp_path / "rl"
    evaluation = ["eval.every_n_steps=2", "eval.num_prompts=32", "eval.max_new_tokens=32", "data.num_eval=32"]
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *LONG, *evaluation, "trainer.devices=2"]
    process = start(args)
    wait_for(output, rows=3, process=process)  # steps 0 and 1 done: the evaluation of step 2 is under way
    stdout, stderr = stop_group(process, within=30)
    checkpoint = assert_stopped(output, args, stdout, stderr, process.returncode)
    assert stderr.count("warning: SIGTERM received") == 2  # each rank once: nobody forwards it a second time
    steps = int(checkpoint.stem[5:]) + 1
    resume_one_step(args, steps)
    logged = [int(row["step"]) for row in read_metrics(output / "metrics.csv")]
    assert logged == sorted(logged) and steps - 1 in logged  # in order, up to the step the resume added
    assert (output / "hf" / "config.json").is_file()


LONG_STEP = [
    *RL_SHORT,
    "trainer.max_steps=200",
    "trainer.checkpoint_every_n_steps=1",
    "eval.every_n_steps=0",
    "rollout.prompts_per_step=16",
    "rollout.max_new_tokens=24",
    "algorithm.mini_batch_prompts=1",  # 16 optimizer updates per step, an agreement point between each two
    "algorithm.filter_groups=false",
]
"""Steps of many updates, a checkpoint after each."""


def stop_inside_step(args: list[str], output: Path) -> tuple[subprocess.Popen, str, str, float]:
    """Start ``args`` (with ``-v``), SIGTERM the group once step 1's rollouts are taken (its debug line: the updates
    begin), and return the process, its output and the seconds from the signal to the end of every process."""
    process = start(args)
    seen = []
    for line in process.stderr:  # the updates of step 1 begin once its groups are counted
        seen.append(line.decode())
        if "klear.stages.rl: step 1: " in seen[-1]:
            break
    else:
        raise AssertionError(f"the run ended before step 1: {''.join(seen)[-3000:]}")
    signalled = time.monotonic()
    stdout, stderr = stop_group(process, within=60)
    return process, stdout, "".join(seen) + stderr, time.monotonic() - signalled


@pytest.mark.slow  # the default run keeps the same stop on two ranks, which asserts the same discarded step
def test_sigterm_inside_a_step_stops_at_its_next_update_and_discards_it(tmp_path):
    """A step longer than the grace would end in the forced exit if the ranks agreed only between steps: they
    agree between its updates too, so the stop comes within one update, the step in progress is discarded (no
    checkpoint of it, no row of it), and the run resumes from the checkpoint before it."""
    output = tmp_path / "rl"
    args = ["-v", "--config", "configs/rl.yaml", f"output_dir={output}", *LONG_STEP]
    process, stdout, stderr, seconds = stop_inside_step(args, output)
    checkpoint = assert_stopped(output, args, stdout, stderr, process.returncode)
    assert stdout.splitlines()[0].startswith("run stopped at step 1: SIGTERM: 1 step in "), stdout
    assert checkpoint.name == "step-000001.ckpt", "step 1 was completed: the stop waited for the step's end"
    assert [row["step"] for row in read_metrics(output / "metrics.csv")] == ["0"]
    print(f"stopped {seconds:.1f} s after SIGTERM")
    resume_one_step(args, 2)
    assert [row["step"] for row in read_metrics(output / "metrics.csv")] == ["0", "1", "2"]


def test_sigterm_to_two_ranks_inside_a_step_stops_both_at_the_same_update(tmp_path):
    output = tmp_path / "rl"
    args = ["-v", "--config", "configs/rl.yaml", f"output_dir={output}", *LONG_STEP, "trainer.devices=2"]
    process, stdout, stderr, seconds = stop_inside_step(args, output)
    checkpoint = assert_stopped(output, args, stdout, stderr, process.returncode)
    assert stdout.splitlines()[0].startswith("run stopped at step 1: SIGTERM: 1 step in "), stdout
    assert checkpoint.name == "step-000001.ckpt"
    assert stderr.count("warning: SIGTERM received") == 2
    print(f"stopped {seconds:.1f} s after SIGTERM")


@pytest.mark.parametrize(
    "engine",
    ["hf", pytest.param("vllm", marks=pytest.mark.slow)],  # the default run: a stop between parts in process
)
def test_sigterm_during_an_evaluation_stops_at_its_next_chunk(tmp_path, engine):
    """SFT's evaluation of 200 problems x 4 samples before step 0, in parts of 2 problems (8 sequences,
    ``eval.batch_size``; on vLLM the next 2 to end of one run): SIGTERM as it begins stops the run before step 0
    trains, where the evaluation and step 0 used to complete first."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    output = tmp_path / "sft"
    evaluation = ["eval.num_prompts=200", "data.num_eval=200", "eval.max_new_tokens=48", "eval.batch_size=8"]
    evaluation.append(f"eval.engine={engine}")
    short = ["trainer.max_steps=50", "trainer.checkpoint_every_n_steps=1", "trainer.progress_bar=false"]
    args = ["-v", "--config", "configs/sft.yaml", f"output_dir={output}", "data.num_train=800", *short, *evaluation]
    process = start(args)
    seen = []
    for line in process.stderr:
        seen.append(line.decode())
        if "klear.eval.in_training: evaluating 200 problems x 4 samples, 2 prompts at a time" in seen[-1]:
            break
    else:
        raise AssertionError(f"no evaluation began: {''.join(seen)[-3000:]}")
    stdout, stderr = stop_group(process, within=60)
    assert process.returncode == EXIT_SIGTERM, stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    summary = [line for line in stdout.splitlines() if "MainProcess" not in line]  # vLLM logs on stdout
    assert summary[0].startswith("run stopped at step 0: SIGTERM: 0 steps in "), summary
    assert summary[-1].startswith("no checkpoint was completed: start again with: ")
    assert not list(output.glob("checkpoints/*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_the_watcher_sees_a_stop_signal_and_restores_the_handler(monkeypatch, signum):
    """SIGUSR1 (SLURM's ``--signal=USR1@N`` ahead of a time limit) is a stop as SIGTERM is, exit status 138."""
    from klear.run import stopping

    monkeypatch.setattr(stopping, "GRACE_S", 2.0)
    before = signal.getsignal(signum)
    stop = SignalStop(on_forced_exit=lambda reason: None)
    with stop.watching():
        os.kill(os.getpid(), signum)  # the default action would end pytest
        assert stop.signalled.wait(timeout=10)
        assert stop.outcome() == (128 + signum, "stopped", f": {signal.Signals(signum).name}")
    assert signal.getsignal(signum) is before
    # The forced exit is disarmed with the watching: this process (pytest) lives on past the grace period.
    stop.grace.join(timeout=5)
    assert not stop.grace.is_alive() and not stop.active


def test_a_rank_that_never_reaches_the_boundary_exits_after_the_grace_period():
    script = textwrap.dedent(
        """
        import os, signal, time
        from klear.run import stopping
        stopping.GRACE_S = 0.5
        stop = stopping.SignalStop(on_forced_exit=lambda reason: print("forced:", reason, flush=True))
        with stop.watching():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)  # blocked, as in a collective whose partner left
        """
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_SIGTERM, result.stderr[-3000:]
    assert result.stdout == "forced: no stop within 0.5 s of SIGTERM\n"
    assert time.monotonic() - started < 30


def test_a_sigterm_delivered_twice_is_one_stop_and_a_later_one_a_second():
    """A scheduler that signals every process reaches a rank directly and through its launcher (torchrun,
    ``klear.compare``): two SIGTERMs at once are one stop; one after `REPEAT_S` stops the rank at once."""
    script = textwrap.dedent(
        """
        import os, signal, time
        from klear.run import stopping
        stopping.GRACE_S, stopping.REPEAT_S = 60.0, 2.0
        stop = stopping.SignalStop(on_forced_exit=lambda reason: print("forced:", reason, flush=True))
        with stop.watching():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)  # the same stop, delivered twice
            time.sleep(3)
            print("still stopping", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # a second stop
            time.sleep(60)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_SIGTERM, result.stderr[-3000:]
    assert result.stdout == "still stopping\nforced: a second SIGTERM\n"
    assert result.stderr.count("warning: SIGTERM received") == 1


def test_a_first_ctrl_c_stops_at_a_step_and_a_second_one_a_second_later_at_once():
    """Ctrl-C during the fit is the agreed stop (a run interrupted at a step, with the step saved where it ends); a
    second press, a second or more later, raises ``KeyboardInterrupt`` at once; a Ctrl-C the process was started
    ignoring (a background job) stays ignored."""
    script = textwrap.dedent(
        """
        import os, signal, time
        from klear.run import stopping
        stop = stopping.SignalStop(on_forced_exit=lambda reason: print("forced:", reason, flush=True))
        with stop.watching():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)  # the same press, delivered twice (the group and a launcher)
            assert stop.signalled.wait(timeout=10) and stop.outcome() == (130, "interrupted", "")
            time.sleep(stopping.REPEAT_S + 0.5)
            print("still stopping", flush=True)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            except KeyboardInterrupt:
                print("interrupted at once", flush=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with stopping.SignalStop(on_forced_exit=print).watching():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "still stopping\ninterrupted at once\n"
    assert result.stderr.count("warning: Ctrl-C received: ") == 1
    assert "(press Ctrl-C again to stop at once)" in result.stderr


def test_lightning_slurm_auto_requeue_is_off_under_slurm_only(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from klear.run.stopping import cluster_plugins

    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    assert cluster_plugins() == []
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "rl")
    (environment,) = cluster_plugins()
    assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue is False
