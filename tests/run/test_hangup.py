"""SIGHUP: the terminal a command runs in closes (an ssh connection drops, the shell that started it exits). The
command runs on a pseudo-terminal of its own, as its controlling process; the test closes the terminal, which makes
every later write there fail (``EIO``) and sends the command SIGHUP, and sends SIGHUP to its process group too, as a
shell does to its jobs when it hangs up. Each command stops as on SIGTERM (exit status 129): ``klear.fit`` at a step
with its report, its summary and its last checkpoint, and nothing of the run left running; a run under ``nohup``
carries on to its end."""

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.run.test_command_stops import session_processes, wait_until
from tests.runs import RL_SHORT
from tests.test_user_errors import klear

pytestmark = pytest.mark.end_to_end  # closes the terminal of commands started in subprocesses

EXIT_HANGUP = 128 + signal.SIGHUP
LAUNCH = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execvp(sys.argv[1], sys.argv[1:])"
"""Makes the pseudo-terminal on standard input the controlling terminal of the session the process leads, then runs
the command in its place (same process): the command is what the terminal's hangup signals."""
RUN = [
    *RL_SHORT,
    "trainer.max_steps=200",
    "trainer.checkpoint_every_n_steps=1",
    "trainer.progress_bar=true",  # the progress bar writes to the terminal at every step
    "eval.every_n_steps=0",
    "reward.num_workers=2",  # worker processes in the command's process group, which the shell's SIGHUP reaches
    "rollout.max_staleness=1",  # and the rollout worker
]


class Terminal:
    """A pseudo-terminal running ``command`` (in ``cwd``), its output read as it comes until :meth:`hang_up`."""

    def __init__(self, command: list[str], cwd: Path | None = None) -> None:
        self.master, slave = os.openpty()
        root = str(Path(__file__).resolve().parents[2])  # `tests.stages` importable from any cwd
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100", "PYTHONPATH": root}
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, *command],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
        os.close(slave)
        self.output = b""
        self.reading = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while self.reading:
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # the command closed its side
                    return

    def hang_up(self) -> None:
        """Close the terminal, then SIGHUP to the command's process group, as the shell it ran in sends its jobs."""
        self.reading = False
        self.reader.join()
        os.close(self.master)
        time.sleep(0.2)
        os.killpg(self.process.pid, signal.SIGHUP)

    def ended(self) -> int:
        """The command's exit status once it and every process of its session are gone."""
        code = self.process.wait(timeout=120)
        deadline = time.monotonic() + 30
        while (alive := session_processes(self.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive, f"processes of the command still running: {alive}"
        return code


def python_m(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


@pytest.mark.slow  # the default run keeps the hangup through tee (a stop at a step) and SIGTERM's stop and resume
def test_a_run_whose_terminal_closes_stops_at_a_step_and_resumes(tmp_path):
    output = tmp_path / "run"
    args = ["klear.fit", "--config", "configs/rl.yaml", *RUN, f"output_dir={output}"]
    terminal = Terminal(python_m(*args))
    wait_until(lambda: any(output.glob("checkpoints/step-*.ckpt")), terminal.process, "checkpoint")
    assert b"step" in terminal.output  # the progress bar was drawn on the terminal
    terminal.hang_up()
    assert terminal.ended() == EXIT_HANGUP
    summary = json.loads((output / "summary.json").read_text())
    assert summary["status"].startswith("stopped at step ") and summary["status"].endswith(": SIGHUP"), summary
    assert (output / "report.md").exists() and not (output / ".klear.lock").exists()

    checkpoint = max(output.glob("checkpoints/step-*.ckpt"))
    steps = int(checkpoint.stem.removeprefix("step-")) + 1
    resumed = klear(*[arg.replace("max_steps=200", f"max_steps={steps}") for arg in args], "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((output / "summary.json").read_text())["status"] == "finished"


def test_a_run_piped_into_tee_stops_at_a_step_when_its_terminal_closes(tmp_path):
    """``klear.fit ... | tee run.log``: the hangup ends ``tee`` too, so the run's output is a pipe without a reader
    (a write there fails with ``EPIPE``, and rich's progress bar exits on it): the run still stops as on SIGHUP."""
    output, log = tmp_path / "run", tmp_path / "run.log"
    args = ["klear.fit", "--config", "configs/rl.yaml", *RUN, f"output_dir={output}", "rollout.max_staleness=0"]
    terminal = Terminal(["bash", "-c", f"{shlex.join(python_m(*args))} 2>&1 | tee {shlex.quote(str(log))}"])
    wait_until(lambda: any(output.glob("checkpoints/step-*.ckpt")), terminal.process, "checkpoint")
    terminal.hang_up()
    terminal.ended()  # the shell's status: it was ended by the hangup
    summary = json.loads((output / "summary.json").read_text())
    assert summary["status"].startswith("stopped at step ") and summary["status"].endswith(": SIGHUP"), summary
    assert not (output / ".klear.lock").exists() and (output / "report.md").exists()
    assert "INFO klear" in log.read_text()  # the run's lines went through tee until the hangup


@pytest.mark.slow  # the default run keeps the hangup through tee, which nohup keeps from the run
def test_a_run_under_nohup_outlives_its_terminal(tmp_path):
    output = tmp_path / "run"
    args = ["klear.fit", "--config", str(Path("configs/rl.yaml").resolve()), *RUN, f"output_dir={output}"]
    terminal = Terminal(["nohup", *python_m(*[arg.replace("max_steps=200", "max_steps=4") for arg in args])], tmp_path)
    wait_until(lambda: any(output.glob("checkpoints/step-*.ckpt")), terminal.process, "checkpoint")
    terminal.hang_up()
    assert terminal.ended() == 0, (tmp_path / "nohup.out").read_text()[-3000:]
    assert json.loads((output / "summary.json").read_text())["status"] == "finished"
    assert "run finished: " in (tmp_path / "nohup.out").read_text()


# The default run keeps SIGHUP's stop of klear.fit (through tee), and SIGTERM's of a data command and a comparison
# (tests/run/test_command_stops.py), which stop on SIGHUP through the same handler.
@pytest.mark.slow  # the default run keeps the hangup of klear.fit and SIGTERM's stop of these commands
def test_data_commands_and_comparisons_stop_when_their_terminal_closes(tmp_path):
    out = tmp_path / "big.jsonl"
    terminal = Terminal(python_m("klear.data", "synthetic", "--task", "math", "--num", "10000000", "--out", str(out)))
    wait_until((tmp_path / ".big.jsonl.klear.lock").exists, terminal.process, "lock on the output")
    terminal.hang_up()
    assert terminal.ended() == EXIT_HANGUP
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file, no lock

    output = tmp_path / "cmp"
    args = ["klear.compare", "--config", "configs/rl.yaml", "--objectives", "gppo", "--seeds", "0"]
    args += [f"output_dir={output}", "trainer.max_steps=40", "trainer.checkpoint_every_n_steps=1"]
    run = output / "runs" / "gppo-seed0"
    terminal = Terminal(python_m(*args))
    wait_until(lambda: any(run.glob("checkpoints/step-*.ckpt")), terminal.process, "checkpoint")
    terminal.hang_up()
    assert terminal.ended() == EXIT_HANGUP
    log = (run / "log.txt").read_text()  # the run, in a session of its own, was stopped by the comparison
    assert log.count("warning: SIGTERM received") == 1 and "run stopped at step " in log, log[-3000:]
    assert not (output / ".klear.lock").exists() and not (run / ".klear.lock").exists()
    assert json.loads((run / "wall.json").read_text())["seconds"] > 0


def test_worker_processes_leave_every_stop_to_their_command():
    """The reward pool's workers and the rollout worker (`leave_stops_to_parent`) outlive Ctrl-C, SIGTERM, SIGHUP
    and SIGUSR1 sent to their process group: the command that started them stops them, once it has stopped itself."""
    code = (
        "from klear.runtime.terminal import leave_stops_to_parent; leave_stops_to_parent(); "
        "print('ready', flush=True); import time; time.sleep(60)"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "ready\n"
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            worker.send_signal(signum)
        time.sleep(0.5)
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


STARTING = """
import multiprocessing, os, signal, sys, threading, time
from klear.runtime.terminal import leave_stops_to_parent, starting_worker

def work(ready):
    time.sleep(1.0)  # a worker importing torch: the stops come now
    leave_stops_to_parent()
    ready.send(True)
    time.sleep(60)

if __name__ == "__main__":
    stops = []
    signal.signal(signal.SIGINT, lambda signum, frame: stops.append("during" if starting else "after"))
    # another thread, started before (a library's pool): the kernel gives it a signal sent to the process
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    context = multiprocessing.get_context("spawn")
    answer, ready = context.Pipe(duplex=False)  # no semaphore: the worker is this process's first spawn
    worker = context.Process(target=work, args=(ready,), daemon=True)
    starting = True
    with starting_worker():
        worker.start()
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C to the group reaches the command too
        time.sleep(0.2)
        starting = False
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        os.kill(worker.pid, signum)
    print(stops, answer.poll(30) and answer.recv(), worker.is_alive(), flush=True)
    worker.kill()
"""


def test_a_worker_signalled_while_it_starts_leaves_the_stop_to_its_command(tmp_path):
    """Ctrl-C or SIGTERM to the process group while a worker is still starting (importing, seconds) ends neither the
    worker nor in a traceback (`starting_worker`): it starts with the stops blocked until it ignores them, and its
    command gets its own stop once the start is done, not lost. The worker is the script's first spawn, whose start
    also starts multiprocessing's resource tracker, which unblocks SIGINT and SIGTERM in the starting thread. The
    command has another thread, which the kernel gives the stop to: its handler still waits for the start's end (a
    stop handled between the worker's spawn and the data sent to it left the worker in a traceback)."""
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout == "['after'] True True\n"
