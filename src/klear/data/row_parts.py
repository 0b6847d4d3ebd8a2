"""A JSON-lines file's rows read a part at a time, each part let go once the next is read: what a check of every row
of a large file holds is one part of its rows and what it made of the others, not every row at once (``klear.fit``'s
preflight, `klear.data.preflight`; 500,000 rows in verl's layout are 1.2 GB as Python objects).
"""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

from klear.data.readers import BadRow, data_suffix, jsonl_entries, refuse_special_file


class RowParts:
    """The rows of a local ``.jsonl`` file (compressed or not), ``size`` lines at a time: ``rows`` holds this part's,
    ``bad`` every line read so far that is no row; `more` reads the next part in place of this one, ``whole`` once
    the file holds no more. The first part read holds a row, unless no line of the file is one."""

    SIZE = 65_536
    """Lines a part holds by default: some tens of megabytes of rows."""

    def __init__(self, source: str, size: int = SIZE) -> None:
        self.source, self.size, self.bad, self.whole = source, size, [], False
        local = Path(os.path.expanduser(source))
        refuse_special_file(local, source)
        self._entries = jsonl_entries(local, source)
        self.more()
        while not self.rows and not self.whole:  # the first lines unreadable: on to a row
            self.more()

    @staticmethod
    def fits(source: str) -> bool:
        """Whether ``source`` is a local JSON-lines file (which can be read a part at a time)."""
        local = Path(os.path.expanduser(source))
        return data_suffix(local) == ".jsonl" and local.is_file()

    def more(self) -> None:
        """The next part's rows in ``rows``; its bad lines added to ``bad``."""
        self.rows = []
        count = 0
        for count, (line, entry) in enumerate(islice(self._entries, self.size), start=1):  # noqa: B007
            if isinstance(entry, BadRow):
                self.bad.append(entry)
            else:
                self.rows.append((line, entry))
        self.whole = count < self.size
