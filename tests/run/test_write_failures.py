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

from klear.data.readers import written
from klear.run.directory import checkpoint_problem, with_path, write_failure
from tests.runs import RL_SHORT

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in subprocesses, on one and two ranks

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
    assert left == ["config.yaml", "data_report.json", "metrics.csv", "report.md", "samples.jsonl", "summary.json"]
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


LIMIT_AFTER = '''
"""Written by tests/run/test_write_failures.py: in the rank LIMIT_RANK (Lightning's LOCAL_RANK, 0 in the process
started), once a file whose path matches LIMIT_AFTER is opened for writing, every file of the process is limited
to LIMIT_BYTES (RLIMIT_FSIZE): a write past it fails with EFBIG, as on a full disk, from then on."""
import fnmatch, os, resource, signal, sys

if "LIMIT_AFTER" in os.environ and os.environ.get("LOCAL_RANK", "0") == os.environ["LIMIT_RANK"]:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit_after(event, args):  # from the first opening for writing of a matching file
        if event != "open":
            return
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if mode is not None else flags & (os.O_WRONLY | os.O_RDWR)
        if writes and fnmatch.fnmatch(str(path), os.environ["LIMIT_AFTER"]):
            limit = int(os.environ["LIMIT_BYTES"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    sys.addaudithook(limit_after)
'''
"""A ``sitecustomize`` that makes a disk full at a chosen moment of a run, in one rank: the writes before it (an
earlier checkpoint) succeed and the other ranks' writes are untouched."""
SHORT = ["--config", "configs/rl.yaml", *RL_SHORT, "trainer.max_steps=4", "eval.every_n_steps=0"]
EFBIG_HINT = "raise the file size limit (ulimit -f) or set output_dir=... to another filesystem"


def fit_limited(tmp_path: Path, args: list[str], after: str, rank: int = 0, limit: int = LIMIT, resume=False):
    """``python -m klear.fit ARGS`` whose rank ``rank`` can write no file past ``limit`` bytes once it opened a file
    matching ``after``; a traceback fails the test. Its output is read to the end, so every rank has exited (each
    holds the pipes) when this returns, well inside gloo's 30-minute timeout."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(LIMIT_AFTER)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    env.update(LIMIT_AFTER=after, LIMIT_RANK=str(rank), LIMIT_BYTES=str(limit))
    command = [sys.executable, "-m", "klear.fit", *args, *(["--resume"] if resume else [])]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    return result


def errors_of(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def run_files(output: Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() for path in sorted(output.rglob("*")) if path.is_file()}


@pytest.mark.slow  # the default run keeps the checkpoint and the data report a full disk cannot hold
def test_an_export_that_cannot_be_written_leaves_no_hf_and_the_checkpoint_resumes_it(tmp_path):
    output = tmp_path / "rl"
    args = [*SHORT, f"output_dir={output}"]
    failed = fit_limited(tmp_path, args, after=f"{output}/*config.json")  # the export's first file
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert errors_of(failed) == [f"error: file too large writing {output / 'hf'}; {EFBIG_HINT}"]
    summary = failed.stdout.splitlines()
    assert summary[0].startswith("run failed at step 4: OSError: [Errno 27] File too large: "), summary
    assert "model:" not in failed.stdout  # no hf/ is claimed
    checkpoint = output / "checkpoints" / "step-000004.ckpt"
    assert (
        summary[-1]
        == f"nothing is lost: {checkpoint} is kept; resume with: python -m klear.fit {' '.join(args)} --resume"
    )
    assert checkpoint_problem(checkpoint) is None
    assert sorted(path.name for path in output.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "data_report.json",
        "metrics.csv",
        "report.md",
        "samples.jsonl",
        "summary.json",
    ]
    assert "no `hf/`" in (output / "report.md").read_text()
    # The command the summary gives exports the model of the kept checkpoint.
    resumed = fit_limited(tmp_path, args, after="never", resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"model: {output / 'hf'}; " in resumed.stdout
    exported = run_files(output / "hf")
    assert "model.safetensors" in exported and "config.json" in exported
    # A later export that fails leaves the complete one in place, byte for byte.
    longer = [*args, "trainer.max_steps=5"]
    again = fit_limited(tmp_path, longer, after=f"{output}/*config.json", resume=True)
    assert again.returncode == 1 and errors_of(again) == [
        f"error: file too large writing {output / 'hf'}; {EFBIG_HINT}"
    ]
    assert run_files(output / "hf") == exported
    assert not [path for path in output.iterdir() if path.name.startswith(".")]
    assert checkpoint_problem(output / "checkpoints" / "step-000005.ckpt") is None


@pytest.mark.parametrize(
    ("strategy", "rank"),
    [pytest.param("ddp", 0, marks=pytest.mark.slow), ("fsdp2", 1)],  # the default run keeps a shard's failure
    ids=["ddp-rank0-writes-the-checkpoint", "fsdp2-rank1-writes-its-shard"],
)
def test_a_checkpoint_one_rank_cannot_write_stops_every_rank_with_one_line(tmp_path, strategy, rank):
    """Under ddp rank 0 writes the checkpoint alone; under fsdp2 every rank writes its shard, and rank 1's fails
    here: either way every rank stops at once with the one line rank 0 prints, and the earlier checkpoint is kept."""
    output = tmp_path / "rl"
    args = [*SHORT, "trainer.devices=2", f"trainer.strategy={strategy}", f"output_dir={output}"]
    result = fit_limited(tmp_path, args, after=f"{output}/checkpoints/step-000004*", rank=rank, limit=16 * 1024)
    assert result.returncode == 1, result.stderr[-3000:]
    failed = output / "checkpoints" / "step-000004.ckpt"
    assert errors_of(result) == [f"error: file too large writing {failed}; {EFBIG_HINT}"]
    summary = result.stdout.splitlines()
    assert f": OSError on rank {rank}: [Errno 27] File too large: '{failed}': 4 steps in " in summary[0], summary
    kept = output / "checkpoints" / "step-000002.ckpt"
    assert summary[-1] == f"nothing is lost: {kept} is kept; resume with: python -m klear.fit {' '.join(args)} --resume"
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == ["step-000002.ckpt"]
    assert checkpoint_problem(kept) is None
    assert "**Status:** failed at step " in (output / "report.md").read_text()


@pytest.mark.slow  # two fsdp2 ranks; the default run keeps a shard rank 1 cannot write
def test_a_sharded_export_rank_0_cannot_write_stops_both_ranks_and_keeps_the_checkpoint(tmp_path):
    """fsdp2 streams the export: rank 0 writes each tensor the ranks gather together. Its failed write must not
    leave rank 1 waiting in the next gather: both stop, with one line, and no hf/."""
    output = tmp_path / "rl"
    args = [*SHORT, "trainer.devices=2", "trainer.strategy=fsdp2", f"output_dir={output}"]
    result = fit_limited(tmp_path, args, after=f"{output}/*config.json", limit=16 * 1024)
    assert result.returncode == 1, result.stderr[-3000:]
    assert errors_of(result) == [f"error: file too large writing {output / 'hf'}; {EFBIG_HINT}"]
    assert "model:" not in result.stdout
    checkpoint = output / "checkpoints" / "step-000004.ckpt"
    assert result.stdout.splitlines()[-1].startswith(f"nothing is lost: {checkpoint} is kept; resume with: ")
    assert checkpoint_problem(checkpoint) is None
    assert not (output / "hf").exists() and not [path for path in output.iterdir() if path.name.startswith(".")]


def test_a_data_report_the_disk_cannot_hold_is_one_line_before_the_first_step(tmp_path):
    output = tmp_path / "rl"
    result = fit_limited(tmp_path, [*SHORT, f"output_dir={output}"], after=f"{output}/*data_report*", limit=0)
    assert result.returncode == 2, result.stderr[-3000:]
    assert errors_of(result) == [f"error: file too large writing {output / 'data_report.json'}; {EFBIG_HINT}"]
    assert not output.exists()  # a refused start leaves no folder it made (config.yaml comes after the data)
