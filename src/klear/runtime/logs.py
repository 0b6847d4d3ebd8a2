"""Third-party loggers kept quiet where what they say is no news to a user."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet(logger: str) -> Iterator[None]:
    """Only errors from ``logger`` meanwhile."""
    handle = logging.getLogger(logger)
    level = handle.level
    handle.setLevel(logging.ERROR)
    try:
        yield
    finally:
        handle.setLevel(level)
