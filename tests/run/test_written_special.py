"""`klear.run.directory.written` replaces only a regular file: a FIFO (or a device) at the path is left as it is,
with an ``OSError`` naming the path, and no temporary file is left behind."""

import errno
import os
import stat

import pytest

from klear.data.readers import special_file, written
from klear.run.directory import write_failure


def test_written_leaves_a_fifo_alone(tmp_path):
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as raised:
        written(fifo, lambda path: path.write_text("x"))
    assert raised.value.errno == errno.EEXIST and raised.value.filename == str(fifo)
    assert write_failure(raised.value, tmp_path, move="set --out").startswith(
        f"not a regular file but a named pipe, which is never replaced writing {fifo}; "
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_written_refuses_a_fifo_made_while_it_writes(tmp_path):
    out = tmp_path / "out.jsonl"

    def write(path):
        path.write_text("x")
        os.mkfifo(out)  # another process puts one there meanwhile

    with pytest.raises(OSError, match="never replaced"):
        written(out, write)
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_written_still_replaces_files_and_links_to_them(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("old")
    written(target, lambda path: path.write_text("new"))
    assert target.read_text() == "new"
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    written(link, lambda path: path.write_text("via link"))
    assert not link.is_symlink() and link.read_text() == "via link" and target.read_text() == "new"


def test_special_file_names_the_kind(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    link = tmp_path / "l"
    link.symlink_to(fifo)
    (tmp_path / "r").write_text("")
    assert special_file(fifo) == special_file(link) == "a named pipe"
    assert special_file(tmp_path / "r") is None and special_file(tmp_path) is None
    assert special_file(tmp_path / "missing") is None
