"""The first rows of a data input, read as far as a look at them needs (``klear.data show``, ``klear.eval
--limit``)."""

from __future__ import annotations

from pathlib import Path

from klear.data.readers import BadRow, read_numbered


class FirstRows:
    """The first rows of a data input, good or bad, read as far as they are needed: ``count`` of them at first (on
    until one is readable), four times as many at each `more`. A jsonl or parquet file is read no further
    (`read_numbered`'s ``first``), so a look at the start of a file of millions of rows takes a moment."""

    def __init__(self, source: str | Path, count: int) -> None:
        self.source = source
        self._read(max(count, 1))
        while not self.rows and not self.whole:  # the first lines unreadable: on to a row
            self.more()

    def more(self) -> None:
        """Read four times as many: ``rows`` and ``bad`` hold all read so far; ``whole``: the input holds no more."""
        self._read(4 * self.count)

    def _read(self, count: int) -> None:
        self.count = count
        self.rows, self.bad = read_numbered(self.source, first=count)
        self.whole = len(self.rows) + len(self.bad) < count

    def items(self) -> list[tuple[int, dict | BadRow]]:
        """The rows read and the lines that are no row, in file order."""
        return sorted(self.rows + [(row.line, row) for row in self.bad], key=lambda pair: pair[0])
