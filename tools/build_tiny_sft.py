"""Rebuild a shipped checkpoint: ``tiny-sft`` (the tiny model after ``configs/sft.yaml``, the arithmetic task) or
``tiny-sft-code`` (after ``configs/sft_code.yaml``, the programming task).

The RL stage's embedded defaults start from these checkpoints, so ``python -m klear.fit --config configs/rl.yaml``
(and ``configs/rl_code.yaml``) work on a fresh clone without an SFT run first. Each is the SFT stage's own output,
copied with a stamp that records the command, the held-out accuracy and the sizes; rerun this tool whenever the
tiny model, the tokenizer or a synthetic task change (a test fails when a shipped checkpoint no longer matches).

    python tools/build_tiny_sft.py [--name tiny-sft|tiny-sft-code] [--output-dir DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

from klear.fit import main as fit
from klear.models import CHECKPOINTS_DIR, SHIPPED
from klear.models.tiny import TINY_SIZES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", choices=sorted(SHIPPED), default="tiny-sft", help="the checkpoint to rebuild")
    parser.add_argument("--output-dir", help="where the SFT run goes (default: outputs/<name>-build)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    output_dir = args.output_dir or f"outputs/{args.name}-build"
    command = ["--config", SHIPPED[args.name], f"output_dir={output_dir}", "--overwrite", *args.overrides]
    if fit(command) != 0:
        raise SystemExit("SFT failed")
    with (Path(output_dir) / "metrics.csv").open(newline="") as file:
        evals = [row for row in csv.DictReader(file) if row["eval/accuracy"]]
    source, target = Path(output_dir) / "hf", CHECKPOINTS_DIR / args.name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in source.iterdir():  # everything save_pretrained wrote (weights, configs, tokenizer, chat template)
        shutil.copy(path, target / path.name)
    stamp = {
        "command": "python -m klear.fit " + " ".join(command),
        "eval_accuracy_start": float(evals[0]["eval/accuracy"]),
        "eval_accuracy_end": float(evals[-1]["eval/accuracy"]),
        "tiny_sizes": TINY_SIZES,
    }
    (target / "klear_tiny_sft.json").write_text(json.dumps(stamp, indent=2) + "\n")
    print(f"wrote {target}: eval/accuracy {stamp['eval_accuracy_start']:.3f} -> {stamp['eval_accuracy_end']:.3f}")


if __name__ == "__main__":
    main()
