"""``python -m klear.data tokenize --config CFG data.cache_dir=DIR``: an SFT run's training sets tokenized into its
``data.cache_dir`` ahead of the run, so that its first start reads them back instead of tokenizing them.

At 10^10 tokens tokenizing is hours; this lets it happen on a CPU machine before GPUs are booked, or once for a
sweep. It loads each set of ``data.train`` through `klear.data.sft_sets.sft_train_sets`, the function the run loads
them with, with the tokenizer of ``model.path`` (only its tokenizer files are read, not the weights), so the run
with the same config and overrides finds the same entries. A set already kept is read back and checked, not
tokenized again. Unlike a run, which trains without the cache when it cannot keep a set, this command fails when a
set is not kept (the log line before it says why), since keeping them is all it does.
"""

from __future__ import annotations

import argparse
import os

from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.prep.paths import Files
from klear.prep.rowfiles import CommandError
from klear.prep.show import model_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, as klear.fit takes them (the run's own)"
    )
    parser.add_argument(
        "--config", help="the SFT run's config; default: the SFT stage's defaults (the embedded default's set)"
    )


def files(args: argparse.Namespace) -> Files:
    return Files()  # entries are written whole under their own locks (klear.data.sft_cache)


def run(args: argparse.Namespace) -> str:
    overrides = list(args.overrides) if args.config else ["stage=sft", *args.overrides]
    config = load_config(args.config, overrides)  # a bad key or value: one line, before the imports below
    if config.stage != "sft":
        raise CommandError(
            f"--config {args.config}: tokenize keeps the training sets of an SFT run; this is an {config.stage} config"
        )
    if not config.data.cache_dir:
        raise CommandError("data.cache_dir is not set: give the folder the run reads, data.cache_dir=DIR")
    from klear.data.sft_sets import sft_train_sets

    settings = OmegaConf.to_object(config)
    sets = sft_train_sets(settings, model_tokenizer(settings))
    where = os.path.expanduser(config.data.cache_dir)
    not_kept = [key.replace("/", ".") for key, (made, _) in sets.items() if made.kept is None]
    if not_kept:
        raise CommandError(f"data.{not_kept[0]} is not kept in data.cache_dir {where} (the line above says why)")
    made = [made for made, _ in sets.values()]
    read = sum(item.read_from is not None for item in made)
    examples, tokens = sum(len(item.examples) for item in made), sum(item.examples.tokens for item in made)
    return (
        f"tokenize: {len(made)} set{'s' if len(made) != 1 else ''} of data.train kept in {where} ({examples} examples, "
        f"{tokens} tokens; {len(made) - read} tokenized now, {read} already kept)"
    )
