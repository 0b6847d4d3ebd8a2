"""What every ``python -m klear.*`` command does around its ``main``: log lines, no download progress bars, and
``main``'s return value as the exit status."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable


def run(main: Callable[[], int]) -> None:
    from transformers.utils import logging as transformers_logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    transformers_logging.disable_progress_bar()
    sys.exit(main())
