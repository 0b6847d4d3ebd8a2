"""Rebuild a shipped checkpoint: ``tiny-sft`` (the tiny model after ``configs/sft.yaml``, the arithmetic task),
``tiny-sft-code`` (after ``configs/sft_code.yaml``, the programming task) or ``tiny-sft-testbed`` (after
``configs/sft_testbed.yaml``: the arithmetic task, every answer boxed, stopped early; the ablations' start).

The RL stage's embedded defaults start from these checkpoints, so ``python -m klear.fit --config configs/rl.yaml``
(and ``configs/rl_code.yaml``) work on a fresh clone without an SFT run first. Each is the SFT stage's own output,
copied with a stamp that records the command, the held-out accuracy, the share of boxed answers (arithmetic
checkpoints) and the sizes; rerun this tool whenever the
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
    if args.name != "tiny-sft-code":
        stamp["boxed_rate"] = boxed_rate(target)
    (target / "klear_tiny_sft.json").write_text(json.dumps(stamp, indent=2) + "\n")
    boxed = f", boxed {stamp['boxed_rate']:.3f}" if "boxed_rate" in stamp else ""
    accuracy = f"{stamp['eval_accuracy_start']:.3f} -> {stamp['eval_accuracy_end']:.3f}"
    print(f"wrote {target}: eval/accuracy {accuracy}{boxed}")


def boxed_rate(folder: Path, num: int = 200) -> float:
    """Share of sampled answers to the held-out arithmetic problems that end in a ``\\boxed{}`` the verifier can
    read, right or wrong: at the eval protocol (temperature 0.6, top-p 0.95, 4 samples)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klear.config import EvalConfig
    from klear.data.problems import Task, load_problems
    from klear.data.synthetic import DEFAULT_LEVELS
    from klear.eval.in_training import evaluate
    from klear.rewards import get_reward
    from klear.rewards.extract import last_boxed
    from klear.rollout.hf import HFEngine

    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    levels = list(DEFAULT_LEVELS)
    problems = load_problems("synthetic", Task("math"), get_reward("math"), split="eval", num=num, levels=levels)
    config = EvalConfig(num_prompts=num, max_new_tokens=96, temperature=0.6, top_p=0.95, samples=4)
    boxed = evaluate(
        HFEngine(model, tokenizer),
        tokenizer,
        problems.problems,
        config,
        lambda texts, _: [last_boxed(text, 10_000) is not None for text in texts],
    )
    return boxed.metrics["eval/accuracy"]


if __name__ == "__main__":
    main()
