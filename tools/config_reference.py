"""Write the key reference of ``docs/configuration.md`` (between its ``<!-- keys:begin -->`` / ``<!-- keys:end -->``
markers) from the schema's field docs: ``python tools/config_reference.py``; ``--check`` exits 1 when the page is
out of date instead of writing it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from klear.config.help import markdown_reference

PAGE = Path(__file__).parents[1] / "docs" / "configuration.md"
BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"


def updated(text: str) -> str:
    """``text`` with the generated reference between the markers."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown_reference()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page is out of date; write nothing")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    if updated(text) == text:
        return 0
    if args.check:
        print(f"{PAGE} is out of date: run python tools/config_reference.py", file=sys.stderr)
        return 1
    PAGE.write_text(updated(text))
    print(f"wrote the key reference into {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
