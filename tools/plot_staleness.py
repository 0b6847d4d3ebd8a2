"""Draw how each objective degrades with stale rollouts, from the ``comparison.csv`` of one or more
``python -m klear.compare`` runs whose variants set ``rollout.max_staleness``.

One column per objective, one row per metric (training reward, approximate KL to the policy the ratio is taken
against, entropy), one line per variant (the part of the run label after ``+``) with its 95% band over seeds; a
variant keeps its colour everywhere. A line ends where a seed stops updating (every group filtered).

It also prints a table of final ``eval/accuracy`` per objective and variant (mean and 95% t-interval over seeds)
with each variant's paired difference from the objective's baseline variant (``base``: runs labelled by the
objective alone, or ``sync``), p-values Holm-corrected over every difference in the table.

    python tools/plot_staleness.py OUTPUT_DIR [OUTPUT_DIR ...] [--objectives ppo,gppo] --out docs/results_staleness.png
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from klear.eval.stats import holm, mean_ci, paired_difference

METRICS = [
    ("reward/mean", "training reward"),
    ("objective/approx_kl", "approx KL to the ratio's pi_old"),
    ("actor/entropy", "entropy (nats / token)"),
]


def read_runs(directories: list[str]) -> dict[tuple[str, str], dict[int, dict[int, dict[str, float]]]]:
    """(objective, variant) -> seed -> step -> metrics, from each directory's ``comparison.csv``."""
    runs: dict = defaultdict(lambda: defaultdict(dict))
    for directory in directories:
        with (Path(directory) / "comparison.csv").open(newline="") as file:
            for row in csv.DictReader(file):
                variant = row["label"].partition("+")[2] or "base"
                values = {
                    key: float(value) for key, value in row.items() if value and key not in ("label", "objective")
                }
                runs[(row["objective"], variant)][int(row["seed"])][int(values["step"])] = values
    return runs


def plot(runs: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = list(dict.fromkeys(objective for objective, _ in runs))
    variants = list(dict.fromkeys(variant for _, variant in runs))
    colours = {variant: f"C{index}" for index, variant in enumerate(variants)}
    figure, axes = plt.subplots(
        len(METRICS), len(objectives), figsize=(3.6 * len(objectives), 2.7 * len(METRICS) + 0.8), squeeze=False
    )
    for column, objective in enumerate(objectives):
        for row, (key, name) in enumerate(METRICS):
            axis = axes[row][column]
            for variant in variants:
                seeds = runs.get((objective, variant))
                if not seeds:
                    continue
                steps = sorted(set.intersection(*({s for s, v in rows.items() if key in v} for rows in seeds.values())))
                if not steps:
                    continue
                stats = [mean_ci([rows[step][key] for rows in seeds.values()]) for step in steps]
                mean = [m for m, _ in stats]
                axis.plot(steps, mean, color=colours[variant], linewidth=1.5, label=variant)
                axis.fill_between(
                    steps, [m - h for m, h in stats], [m + h for m, h in stats], color=colours[variant], alpha=0.2
                )
            axis.set_title(f"{objective}: {name}", fontsize=10)
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(variants), frameon=False)
    figure.suptitle("Objectives under stale rollouts: mean over seeds, 95% bands")
    figure.tight_layout(rect=(0, 0.05, 1, 0.97))
    figure.savefig(out, dpi=110)


def final_accuracy(rows: dict[int, dict[str, float]]) -> float:
    """The last logged ``eval/accuracy`` of one seed's run."""
    return [values["eval/accuracy"] for _, values in sorted(rows.items()) if "eval/accuracy" in values][-1]


def table(runs: dict) -> str:
    """Markdown: one row per objective, final accuracy per variant, paired differences from the baseline variant."""
    objectives = list(dict.fromkeys(objective for objective, _ in runs))
    variants = list(dict.fromkeys(variant for _, variant in runs))
    base = next((name for name in ("base", "sync") if name in variants), variants[0])
    others = [variant for variant in variants if variant != base]
    finals = {key: {seed: final_accuracy(rows) for seed, rows in seeds.items()} for key, seeds in runs.items()}
    tests = []
    for objective in objectives:
        for variant in others:
            a, b = finals.get((objective, variant), {}), finals.get((objective, base), {})
            seeds = sorted(set(a) & set(b))
            if len(seeds) >= 2:
                tests.append(((objective, variant), paired_difference([a[s] for s in seeds], [b[s] for s in seeds])))
    adjusted = dict(zip([key for key, _ in tests], holm([result[2] for _, result in tests]), strict=True))
    results = dict(tests)
    head = [*variants, *(f"{variant} - {base}" for variant in others)]
    lines = ["| objective | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for objective in objectives:
        cells = []
        for variant in variants:
            values = list(finals.get((objective, variant), {}).values())
            mean, half = mean_ci(values) if values else (float("nan"), 0.0)
            cells.append(f"{mean:.3f} ± {half:.3f}" if values else "—")
        for variant in others:
            if (objective, variant) not in results:
                cells.append("—")
                continue
            mean, half, _ = results[(objective, variant)]
            p = adjusted[(objective, variant)]
            cells.append(f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}], p_holm = {p:.3f}")
        lines.append(f"| {objective} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", nargs="+", help="klear.compare output directories")
    parser.add_argument("--out", default="staleness.png")
    parser.add_argument("--objectives", help="comma-separated objectives to keep (default: every one found)")
    args = parser.parse_args(argv)
    runs = read_runs(args.directories)
    if args.objectives:
        keep = set(args.objectives.split(","))
        runs = {key: seeds for key, seeds in runs.items() if key[0] in keep}
    plot(runs, args.out)
    print(table(runs))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
