"""What a run prints: nothing from third parties that says nothing to a klear user (the progress bar is
`klear.run.progress`). Nothing here imports Lightning: commands call it before their heavy imports.

`quiet_third_party` removes, precisely (by logger and message, or by warning message and module), the lines
Lightning and torch print on every run that need no action: Lightning's advertisement for its cloud logger,
"GPU available: False" / "TPU available" (a CPU run knows), "`Trainer.fit` stopped: `max_epochs=1` reached"
(every klear run is one epoch of ``trainer.max_steps`` steps), the second copy of each Lightning line (its own
handler beside the root's), and the deprecation of ``LeafSpec`` that Lightning's own pytree code triggers in
torch 2.13. Everything else — and these same lines from any other logger or module — still shows. The
``weights_only`` notice is fixed where klear saves and loads checkpoints, not filtered.
"""

from __future__ import annotations

import logging
import warnings

_LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
_NO_ACTION = (
    "💡 Tip:",
    "GPU available: False",
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped: `max_epochs=1` reached",
)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...], level: int) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level and not str(record.msg).startswith(self.prefixes)


def quiet_third_party(level: int = logging.INFO) -> None:
    """Drop the lines of the module docstring, and every Lightning line below ``level`` (``--quiet``: WARNING;
    Lightning resets its loggers' own levels when it is imported, so this is a filter). Calling it again
    replaces the previous call's filters."""
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for existing in [f for f in logger.filters if isinstance(f, _DropMessages)]:
            logger.removeFilter(existing)
        logger.addFilter(_DropMessages(_NO_ACTION, level))
    if logging.getLogger().handlers:  # the command logs through the root: Lightning's own handler would repeat it
        logging.getLogger("lightning").propagate = False
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
