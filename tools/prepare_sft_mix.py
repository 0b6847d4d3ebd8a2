"""Prepare an SFT data mix from jsonl (or json, parquet, datasets) sources: top-K by quality, easy-only filter, weights.

    python tools/prepare_sft_mix.py --spec mix.yaml --out data/sft_mix.jsonl
    python tools/prepare_sft_mix.py --out mix.jsonl --top-k 2 --easy-pass-rate 0.7 \\
        --source name=a,path=a.jsonl,quality=0.9,count=5000 --source name=b,path=b.jsonl,quality=0.4

The same command as ``python -m klear.data mix`` (`klear.data.mix_command`), which also prints the report:
writes the mix (one row per line, each with a ``mix_source`` field) and, beside it, ``<out stem>.report.md``
with the counts per source. The spec file's keys are those of ``klear.data.mixing.MixSpec`` and ``Source``;
command-line settings override the spec's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from klear.data import mix_command
from klear.data.readers import DataError
from klear.data.rowfiles import CommandError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    mix_command.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        summary = mix_command.run(args)
    except (CommandError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    print(out.with_name(f"{out.stem}.report.md").read_text() + "\n" + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
