"""The lock of an output, in this process: a second holder refused by name, the holder's record, stale records (left
by a process killed outright, on this host or another), the folders a lock made, and which process of a job holds.
The commands themselves, two processes and ``kill -9``: ``tests/run/test_one_writer.py``."""

import json
import logging
import os
import re
import socket
import time

import pytest

from klear.run.folder_lock import LOCK_NAME, STALE_S, FolderInUse, FolderLock, launching_process

HOST = socket.gethostname()


def take(path):
    return FolderLock.take(path, "klear.fit", f"output_dir {str(path.parent)!r}", "set output_dir=...")


def leave_record(path, host: str, pid: int = 4242, started: str = "2026-01-02T03:04:05Z") -> None:
    """What a holder killed outright leaves: its record, and no lock on it."""
    path.write_text(json.dumps({"command": "klear.fit", "pid": pid, "host": host, "started": started}) + "\n")


def test_a_second_hold_is_refused_by_name_and_a_released_one_leaves_nothing(tmp_path):
    lock_file = tmp_path / "run" / LOCK_NAME
    first = take(lock_file)
    record = json.loads(lock_file.read_text())
    assert {key: record[key] for key in ("command", "pid", "host")} == {
        "command": "klear.fit",
        "pid": os.getpid(),
        "host": HOST,
    }
    with pytest.raises(FolderInUse) as refused:
        take(lock_file)  # another open file description: flock refuses it even in the same process
    assert str(refused.value) == (
        f"output_dir '{tmp_path / 'run'}' is held by klear.fit, pid {os.getpid()} on host {HOST} since "
        f"{record['started']} (lock file {lock_file}): wait for it to end, or set output_dir=..."
    )
    assert json.loads(lock_file.read_text()) == record  # the refused one changed nothing
    first.release()
    first.release()  # idempotent
    assert sorted(os.listdir(tmp_path / "run")) == []
    take(lock_file).release()  # free again


def test_a_record_left_on_this_host_is_stale_and_taken_over_with_one_warning(tmp_path, caplog):
    lock_file = tmp_path / LOCK_NAME
    leave_record(lock_file, HOST)
    with caplog.at_level(logging.WARNING, logger="klear.run.folder_lock"):
        lock = take(lock_file)
    assert [record.getMessage() for record in caplog.records] == [
        f"output_dir '{tmp_path}': took over the stale hold of klear.fit, pid 4242 on host {HOST} since "
        "2026-01-02T03:04:05Z, which ended without releasing it"
    ]
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    lock.release()


def test_a_record_from_another_host_is_live_until_it_has_not_been_refreshed_for_stale_s(tmp_path, caplog):
    lock_file = tmp_path / LOCK_NAME
    leave_record(lock_file, "node-7")
    with pytest.raises(FolderInUse, match=r"pid 4242 on host node-7 since 2026-01-02T03:04:05Z, refreshed \d+ s ago"):
        take(lock_file)  # its lock is free, but flock may not reach across hosts: its age decides
    assert json.loads(lock_file.read_text())["host"] == "node-7"
    old = time.time() - STALE_S - 10
    os.utime(lock_file, (old, old))
    with caplog.at_level(logging.WARNING, logger="klear.run.folder_lock"):
        take(lock_file).release()
    assert "took over the stale hold of klear.fit, pid 4242 on host node-7" in caplog.text
    assert re.search(r"which its host has not refreshed for 3[0-9]{2} s", caplog.text)


def test_the_folders_a_lock_made_are_removed_when_its_command_is_refused(tmp_path):
    lock_file = tmp_path / "a" / "b" / LOCK_NAME
    lock = take(lock_file)
    assert lock.created == [tmp_path / "a", tmp_path / "a" / "b"]
    lock.release(undo=True)
    assert not (tmp_path / "a").exists()
    kept = take(lock_file)
    (tmp_path / "a" / "b" / "output.txt").write_text("written")
    kept.release(undo=True)  # a folder something was written into stays
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["output.txt"]


@pytest.mark.parametrize(
    ("environ", "first"),
    [
        ({}, True),
        ({"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "2"}, True),  # Lightning's launching process
        ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, False),  # the rank it started
        ({"NODE_RANK": "1", "MASTER_ADDR": "node-0"}, False),  # a second node, before its ranks are numbered
        ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, True),  # torchrun
        ({"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}, False),
        ({"SLURM_PROCID": "0"}, True),
        ({"SLURM_PROCID": "2"}, False),
    ],
)
def test_only_the_first_process_of_a_job_holds_its_outputs(environ, first):
    assert launching_process(environ) is first


def test_a_stop_while_the_lock_is_being_taken_leaves_no_lock_file(tmp_path, monkeypatch):
    """A stop signal raises wherever the command is; one that lands after this process locked the file, while it
    reads the record there, removes the file it holds instead of leaving it behind. A refused take leaves another
    holder's file alone."""
    import klear.run.folder_lock as folder_lock

    path = tmp_path / "out" / LOCK_NAME

    def stopped(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_lock, "_read", stopped)
    with pytest.raises(KeyboardInterrupt):
        take(path)
    assert not path.exists() and not path.parent.exists()  # neither the file nor the folder made for it
    monkeypatch.undo()
    held = take(path)
    with pytest.raises(FolderInUse):
        take(path)
    assert path.exists()
    held.release()
