"""Rebuild the built-in ``tiny-sft`` checkpoint: the tiny model after ``configs/sft.yaml``, shipped in the package.

The RL stage's embedded default starts from this checkpoint, so ``python -m klear.fit --config configs/rl.yaml``
works on a fresh clone without an SFT run first. It is the SFT stage's own output, copied with a stamp that
records the command, the held-out accuracy and the sizes; rerun this tool whenever the tiny model, the tokenizer
or the synthetic task change (a test fails when the shipped checkpoint no longer matches them).

    python tools/build_tiny_sft.py [--output-dir outputs/tiny-sft-build] [key=value ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

from klear.data.tiny_model import TINY_SIZES
from klear.fit import main as fit
from klear.models import TINY_SFT_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="outputs/tiny-sft-build")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    command = ["--config", "configs/sft.yaml", f"output_dir={args.output_dir}", "--overwrite", *args.overrides]
    if fit(command) != 0:
        raise SystemExit("SFT failed")
    with (Path(args.output_dir) / "metrics.csv").open(newline="") as file:
        evals = [row for row in csv.DictReader(file) if row["eval/accuracy"]]
    source = Path(args.output_dir) / "hf"
    if TINY_SFT_DIR.exists():
        shutil.rmtree(TINY_SFT_DIR)
    TINY_SFT_DIR.mkdir(parents=True)
    for path in source.iterdir():  # everything save_pretrained wrote (weights, configs, tokenizer, chat template)
        shutil.copy(path, TINY_SFT_DIR / path.name)
    stamp = {
        "command": "python -m klear.fit " + " ".join(command),
        "eval_accuracy_start": float(evals[0]["eval/accuracy"]),
        "eval_accuracy_end": float(evals[-1]["eval/accuracy"]),
        "tiny_sizes": TINY_SIZES,
    }
    (TINY_SFT_DIR / "klear_tiny_sft.json").write_text(json.dumps(stamp, indent=2) + "\n")
    print(f"wrote {TINY_SFT_DIR}: eval/accuracy {stamp['eval_accuracy_start']:.3f} -> {stamp['eval_accuracy_end']:.3f}")


if __name__ == "__main__":
    main()
