"""A run whose writes fail for real (a file size limit, ``RLIMIT_FSIZE``: ``write`` then fails with ``EFBIG`` as it
fails with ``ENOSPC`` on a full disk) ends with one error line naming the file, a warning for the report it could
not write, the summary with what to do, exit 1, and no half-written file: no traceback, no ``.tmp``, no PNG cut
short. The unit tests write into ``/dev/full``, whose every write fails with ``ENOSPC``."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from klear.run.directory import with_path, write_failure
from klear.run.report import written
from tests.runs import RL_SHORT

LIMIT = 32 * 1024
"""Bytes a file may have: config.yaml, metrics.csv and report.md fit, a checkpoint of the tiny model (2 MB) and
curves.png do not."""


def limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Python ignores it too; a write then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_summary(tmp_path):
    output = tmp_path / "rl"
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *RL_SHORT, "trainer.max_steps=2"]
    args += ["eval.every_n_steps=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "klear.fit", *args],
        preexec_fn=limited,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    checkpoint = output / "checkpoints" / "step-000002.ckpt"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: file too large writing {checkpoint}; raise the file size limit (ulimit -f) or "
        "set output_dir=... to another filesystem"
    ]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: the run's report was not written: file too large writing {output / 'curves.png'}; "
        "raise the file size limit (ulimit -f) or set output_dir=... to another filesystem"
    ]
    summary = result.stdout.splitlines()
    assert summary[0].startswith("run failed at step ") and "OSError: [Errno 27] File too large: " in summary[0]
    fresh = " ".join(arg for arg in args)
    assert summary[-1] == f"no checkpoint was completed: start again with: python -m klear.fit {fresh} --overwrite"
    left = sorted(path.name for path in output.rglob("*") if path.is_file())
    assert left == ["config.yaml", "data_report.json", "metrics.csv", "report.md"]
    report = (output / "report.md").read_text()
    assert "**Status:** failed at step " in report and "curves.png" not in report


def test_written_leaves_the_file_whole_or_absent(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("before")
    with pytest.raises(OSError) as raised:
        written(target, lambda path: os.symlink("/dev/full", path) or path.write_text("x" * 10_000))
    assert raised.value.filename == str(target) and target.read_text() == "before"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["report.md"]
    written(target, lambda path: path.write_text("after"))
    assert target.read_text() == "after" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_write_failure_names_the_file_and_what_to_do():
    try:
        Path("/dev/full").write_text("x")  # fails when the buffer is flushed: the error names no file
    except OSError as error:
        failed = error
    hint = "free space on that filesystem or set output_dir=... to another one"
    assert (
        write_failure(failed, Path("/runs/a")) == f"no space left on device writing the run's files in /runs/a; {hint}"
    )
    named = with_path(failed, Path("/runs/a/metrics.csv"))
    assert write_failure(named, Path("/runs/a")) == f"no space left on device writing /runs/a/metrics.csv; {hint}"
