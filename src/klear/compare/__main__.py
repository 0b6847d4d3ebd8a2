"""``python -m klear.compare --config FILE --objectives A,B --seeds 0,1,2``: see :mod:`klear.compare.cli`."""

from klear import cli
from klear.compare.cli import main

if __name__ == "__main__":
    cli.leave(cli.exit_status(main))  # its runs' set-up is their own (cli.Command.setup)
