"""``python -m klear.data COMMAND``: the data-preparation commands of :mod:`klear.prep`."""

from klear import cli
from klear.prep.cli import main

if __name__ == "__main__":
    cli.run(main)
