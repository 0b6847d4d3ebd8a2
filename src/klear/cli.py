"""The ``klear`` command, and what every ``python -m klear.*`` command does around its ``main``.

``klear fit|eval|compare|data ARGS`` calls the same ``main(argv)`` as ``python -m klear.fit|eval|compare|data
ARGS`` (both forms stay), with the same set-up and exit status, so ``klear COMMAND --help`` lists the
arguments of each. ``klear --help`` and ``klear --version`` import nothing heavy: a command's module (and with
it torch or transformers) is imported only once that command is chosen.

:func:`run` is the set-up the commands share: log lines at INFO, no download progress bars, and ``main``'s
return value as the exit status (141, without a traceback, when stdout's reader closed the pipe early, as in
``klear fit --list-objectives | head -2``), given by :func:`leave`, which ends the process without the
interpreter's teardown of every object.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from klear.errors import did_you_mean


@dataclass(frozen=True)
class Command:
    """A subcommand of ``klear``: the ``module:function`` that ``python -m`` runs, and its one-line help."""

    target: str
    help: str
    setup: bool = True
    """Whether ``python -m`` wraps it in :func:`run`'s set-up (``klear.compare`` exits with ``main()`` alone)."""


COMMANDS: dict[str, Command] = {
    "fit": Command("klear.fit:main", "train one stage, SFT or RL, from a config and key=value overrides"),
    "eval": Command("klear.eval.__main__:main", "avg@k, unbiased pass@k and maj@k of a model on math or code problems"),
    "compare": Command(
        "klear.compare.__main__:main", "objectives x seeds, all else equal, and the comparison report", setup=False
    ),
    "data": Command("klear.data.__main__:main", "data preparation: synthetic, curate, decontaminate, dedup, mix, ..."),
}
"""``klear NAME`` -> the command it runs, in the order ``klear --help`` lists them."""


invoked_as: str | None = None
"""The ``klear`` subcommand running in this process, if the process was started as ``klear COMMAND``."""


def prog(command: str) -> str:
    """What ``COMMAND --help`` calls the command: ``klear eval`` when run as that, else ``python -m klear.eval``."""
    return f"klear {command}" if invoked_as == command else f"python -m klear.{command}"


def setup() -> None:
    """Log lines at INFO and no download progress bars (without importing transformers just for that)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by huggingface_hub and transformers when imported
    if "transformers" in sys.modules:  # imported already: its bars were switched on at import
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def run(main: Callable[[], int]) -> NoReturn:
    """What ``python -m klear.<command>`` does: :func:`setup`, then exit with ``main()``'s return value."""
    setup()
    leave(exit_status(main))


def console() -> NoReturn:
    """The ``klear`` script: :func:`main` as the process, which exits with its return value (:func:`leave`)."""
    leave(main())


def leave(code: int) -> NoReturn:
    """End the process with exit status ``code`` as the interpreter's own exit does, without its teardown.

    After the atexit handlers, Python frees every module and object one by one: for the many that torch,
    transformers and Lightning make, 1.3 s on a 2-core machine after a command's last line (0.6 s for torch
    alone), which changes nothing on disk or on the terminal. What an exit does that matters is kept, in its
    order: threads that are not daemons are waited for, the atexit handlers run (logging flushes its handlers,
    multiprocessing ends its children, weakref finalizers stop the reward workers and remove temporary folders),
    and the standard streams are flushed."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter's exit calls at this point
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a reader that went away: nothing left to write to
            stream.flush()
    os._exit(code)


BROKEN_PIPE = 141
"""The exit status when the reader of stdout went away (``klear fit --list-objectives | head -2``): 128 + SIGPIPE,
what a shell reports for ``seq 100000 | head -2``'s ``seq``."""


PATH_ERRORS = (errno.ENAMETOOLONG, errno.ELOOP)
"""What a path given on the command line can be that no command can use, wherever it is first touched: a name
longer than the file system takes, a loop of symbolic links."""


def exit_status(call: Callable[[], int]) -> int:
    """``call()``'s return value, with stdout flushed; `BROKEN_PIPE` and no traceback when the reader of stdout
    closed the pipe first (stdout then points at devnull, so the interpreter's own flush at exit cannot fail); 2 and
    one ``error:`` line for a path no command can use (`PATH_ERRORS`)."""
    try:
        code = call()
        sys.stdout.flush()  # here, so a closed pipe fails inside the try rather than at interpreter exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except OSError as error:
        if error.errno not in PATH_ERRORS:
            raise
        reason = (error.strerror or str(error)).lower()
        print(f"error: {reason}: {error.filename}; give a shorter path (or one without a link loop)", file=sys.stderr)
        return 2


class OneLineParser(argparse.ArgumentParser):
    """A command's parser whose errors are one ``error:`` line and exit code 2, as every other error of the commands
    is (``error: argument --k: invalid int value: '1e3' (see python -m klear.eval --help)``), instead of argparse's
    usage text; ``--help`` is as argparse writes it."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from klear import __version__

    listing = "\n".join(f"  {name:<9} {command.help}" for name, command in COMMANDS.items())
    parser = OneLineParser(
        prog="klear",
        usage="klear [-h] [--version] COMMAND [ARGS ...]",
        description="Post-training of reasoning LLMs: long-CoT SFT, then RL with verifiable rewards\n"
        f"and pluggable policy objectives.\n\ncommands:\n{listing}",
        epilog="ARGS: those of python -m klear.COMMAND, listed by klear COMMAND --help.\n"
        "klear fit --config FILE --help-config [SECTION] lists the keys of a config.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"klear {__version__}", help="print the version")
    parser.add_argument("command", metavar="COMMAND", choices=COMMANDS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``klear COMMAND ARGS``: the exit status of ``COMMAND``'s ``main(ARGS)``; usage and 2 without a known one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        hint = did_you_mean(argv[0], list(COMMANDS))
        parser.error(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}{hint}")
    # Only the first word is klear's own; the rest goes untouched to the command's parser (its --help included).
    global invoked_as
    invoked_as = parser.parse_args(argv[:1]).command
    command = COMMANDS[invoked_as]
    module, _, function = command.target.partition(":")
    command_main: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
    if command.setup:
        setup()
    return exit_status(lambda: command_main(argv[1:]))
