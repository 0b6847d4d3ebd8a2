"""``python -m klear.eval --model PATH --data FILE.jsonl --k K``: see :mod:`klear.eval.cli`."""

from klear import cli
from klear.eval.cli import main

if __name__ == "__main__":
    cli.run(main)
