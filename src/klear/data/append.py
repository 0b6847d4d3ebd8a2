"""Appending records to a JSON-lines file so that it holds whole lines only, whatever stops the write.

The commands that keep their results as they go (``klear.data curate``'s ``results.jsonl``, ``klear.eval``'s
``partial.jsonl``) append each chunk with `append_jsonl`, and a rerun goes on from every record on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path


def append_jsonl(path: Path, records: Iterable[dict]) -> None:
    """Append ``records``, one JSON object a line as `klear.data.readers.write_jsonl` writes them, in one write
    flushed to disk before returning, so the file keeps only whole lines: a write that fails (a full disk) is cut
    back to the file as it was and raises its `OSError`; one cut short by Ctrl-C or SIGTERM (any other exception)
    keeps the records it wrote whole, and loses the one it was writing."""
    size = path.stat().st_size if path.exists() else 0
    try:
        with path.open("a", encoding="utf-8", errors="backslashreplace") as f:
            f.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
            f.flush()
            os.fsync(f.fileno())
    except BaseException as error:
        with contextlib.suppress(OSError), path.open("r+b") as f:
            if not isinstance(error, OSError):  # up to the last whole line written
                f.seek(size)
                size += f.read().rfind(b"\n") + 1
            f.truncate(size)
        raise
