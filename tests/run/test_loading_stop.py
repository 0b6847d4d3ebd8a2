"""SIGTERM (SIGHUP alike) or Ctrl-C while a run loads its data and model, before its first step: one line, exit
status 143 (129) or 130, and ``output_dir`` as the command found it (a folder it created is removed; an existing
run's files, every one hashed before and after, unchanged, ``--overwrite`` and ``--resume`` alike); ``klear.data
tokenize`` alike leaves no cache entry. Real runs of the commands, signalled while ``configs/sft.yaml`` tokenizes its
25,600 training examples."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klear.config.load import load_config, save_config
from klear.run.directory import RunDir
from klear.run.loading_stop import EXIT_INTERRUPTED, EXIT_SIGTERM
from tests.run.test_resume_checks import digests

pytestmark = pytest.mark.end_to_end  # signals `python -m klear.fit` in subprocesses while they load

LOADING = "INFO klear.data.sft_sets: data.train: synthetic: "
"""The log line before the training examples are tokenized (seconds for the 25,600 of configs/sft.yaml)."""


def signal_while_loading(args: list[str], signum: int, command: str = "klear.fit") -> tuple[int, str, str]:
    """``python -m COMMAND ARGS``, sent ``signum`` once it logs `LOADING`; its exit status, stdout and stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", *command.split(), *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith(LOADING):
            process.send_signal(signum)
            break
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, "".join(seen) + stderr


def assert_one_line(returncode: int, stdout: str, stderr: str, expected: int, line: str) -> None:
    assert returncode == expected, stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith(("error", "warning"))] == []
    assert stdout.splitlines() == [line]


def finished_run(root: Path) -> dict[str, str]:
    """A finished SFT run's files in ``root`` (a real, small checkpoint), and their digests."""
    run = RunDir(root)
    save_config(load_config("configs/sft.yaml", [f"output_dir={root}"]), run.config)
    run.metrics.write_text("train/loss,step\n2.5,0\n2.0,1\n")
    (root / "report.md").write_text("# SFT run\n\n**Status:** finished\n")
    (root / "data_report.json").write_text('{"train": {}}\n')
    run.checkpoints.mkdir()
    torch.save({"state_dict": {"w": torch.arange(64.0)}}, run.checkpoint(2))
    return digests(root)


# SIGHUP goes through SIGTERM's handler: the default run keeps SIGTERM here and SIGHUP at a step (test_hangup.py)
@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGHUP, id="SIGHUP", marks=pytest.mark.slow)],
)
def test_sigterm_while_loading_a_new_run_leaves_no_folder(tmp_path, signum):
    """SIGHUP (a terminal that closes, here sent by hand to a command whose output is still read) stops it alike."""
    output = tmp_path / "new" / "sft"
    result = signal_while_loading(["--config", "configs/sft.yaml", f"output_dir={output}"], signum)
    name = signal.Signals(signum).name
    line = f"run stopped before its first step: {name} while loading; nothing was trained, {output} did not exist "
    assert_one_line(*result, 128 + signum, line + "before and does not now")
    assert not (tmp_path / "new").exists()  # nor the folder above it, which the start made too


@pytest.mark.slow  # the default run keeps SIGTERM while loading a new run and while tokenizing ahead of one
def test_ctrl_c_while_loading_into_an_existing_folder_leaves_it_as_it_was(tmp_path):
    output = tmp_path / "sft"
    output.mkdir()
    (output / "notes.txt").write_text("mine\n")
    result = signal_while_loading(["--config", "configs/sft.yaml", f"output_dir={output}"], signal.SIGINT)
    line = f"run interrupted before its first step: Ctrl-C while loading; nothing was trained, {output} is as it was"
    assert_one_line(*result, EXIT_INTERRUPTED, line)
    assert sorted(path.name for path in output.iterdir()) == ["notes.txt"]


@pytest.mark.slow  # the default run keeps SIGTERM while loading a new run and while tokenizing ahead of one
def test_sigterm_while_loading_over_an_existing_run_changes_none_of_its_files(tmp_path):
    output = tmp_path / "sft"
    output.mkdir()
    before = finished_run(output)
    line = f"run stopped before its first step: SIGTERM while loading; nothing was trained, {output} is as it was"
    for flag in ("--overwrite", "--resume"):
        args = ["--config", "configs/sft.yaml", f"output_dir={output}", flag]
        if flag == "--resume":
            args.append("trainer.max_steps=1700")  # a resumed run may go on longer
        assert_one_line(*signal_while_loading(args, signal.SIGTERM), EXIT_SIGTERM, line)
        assert digests(output) == before, flag


def test_sigterm_while_tokenizing_ahead_of_a_run_is_one_line_and_leaves_no_entry(tmp_path):
    """``python -m klear.data tokenize`` stopped in its set: one line, 143, and nothing in the cache that reads as an
    entry (no ``sft-*.npz``, no temporary file), so the same command tokenizes the set again."""
    cache = tmp_path / "cache"
    args = ["--config", "configs/sft.yaml", f"data.cache_dir={cache}"]
    returncode, stdout, stderr = signal_while_loading(args, signal.SIGTERM, "klear.data tokenize")
    assert returncode == EXIT_SIGTERM and stdout == "" and "Traceback" not in stderr, stderr[-3000:]
    said = "stopped (SIGTERM): the sets kept before it stay in data.cache_dir; rerun the same command to continue"
    assert stderr.splitlines()[-1] == said
    assert [path.name for path in cache.glob("*") if path.suffix != ".lock"] == []
