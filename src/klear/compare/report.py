"""The reports of a comparison: every run's metrics in one CSV, a summary table with confidence intervals and
paired tests, and a figure of the curves with their bands.

Per label (objective or objective+variant), over seeds: final and best ``eval/accuracy`` as mean +- the half-width
of a 95% Student-t interval, the area under the accuracy curve (the mean accuracy over the steps of the run,
trapezoid rule, so early learners score higher), final entropy, mean clip fractions and wall time. Differences
of final accuracy are tested pairwise with a paired t-test over seeds (runs with the same seed share their step-0
rollouts, which is what makes pairing right).
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

from klear.compare.runs import Run
from klear.compare.stats import mean_ci, paired_t_test
from klear.runtime.report import draw_panels, read_metrics

PANELS = [
    ("eval/accuracy", "eval accuracy", "fraction correct"),
    ("reward/mean", "reward (train samples)", "mean reward"),
    ("actor/entropy", "entropy", "nats / token"),
    ("objective/clip_frac_high", "clip fraction high", "fraction of tokens"),
    ("objective/clip_frac_low", "clip fraction low", "fraction of tokens"),
    ("actor/grad_norm", "grad norm", "L2 norm before clipping"),
]
"""Panels of ``comparison.png``: metric, title, y-axis label."""
SIGNIFICANCE = 0.05


def read_run(run: Run) -> list[dict[str, float]]:
    """Rows of a run's metrics.csv with numbers as floats (missing values left out)."""
    return read_metrics(run.directory / "metrics.csv")


def write_reports(output: Path, runs: list[Run], failed: list[Run]) -> list[Path]:
    """Write the reports of the finished runs; returns the files written. Without a finished run there are no
    curves: ``comparison.png`` is not drawn (and one left by an earlier comparison is removed, so that no figure
    contradicts the table)."""
    output.mkdir(parents=True, exist_ok=True)
    done = [run for run in runs if run.finished]
    metrics = {id(run): read_run(run) for run in done}
    _write_csv(output / "comparison.csv", done, metrics)
    labels = list(dict.fromkeys(run.label for run in runs))
    summary = {label: _summarise([r for r in done if r.label == label], metrics) for label in labels}
    (output / "comparison.md").write_text(_markdown(summary, done, failed, metrics))
    written = [output / "comparison.md", output / "comparison.csv"]
    if done:
        _plot(output / "comparison.png", labels, done, metrics)
        written.append(output / "comparison.png")
    else:
        (output / "comparison.png").unlink(missing_ok=True)
    return written


def _write_csv(path: Path, runs: list[Run], metrics: dict[int, list[dict[str, float]]]) -> None:
    keys = sorted({key for run in runs for row in metrics[id(run)] for key in row} - {"step"})
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["label", "objective", "seed", "step", *keys])
        writer.writeheader()
        for run in runs:
            for row in metrics[id(run)]:
                writer.writerow({"label": run.label, "objective": run.objective, "seed": run.seed, **row})


def accuracy_curve(rows: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(row["step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]


def area_under_curve(curve: list[tuple[float, float]]) -> float:
    """Mean accuracy over the run: trapezoid area divided by the step span."""
    if len(curve) < 2:
        return curve[0][1] if curve else 0.0
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in itertools.pairwise(curve))
    return area / (curve[-1][0] - curve[0][0])


def _summarise(runs: list[Run], metrics: dict[int, list[dict[str, float]]]) -> dict[str, object]:
    if not runs:
        return {}
    curves = [accuracy_curve(metrics[id(run)]) for run in runs]

    def mean_of(key: str, rows: list[dict[str, float]]) -> float:
        values = [row[key] for row in rows if key in row]
        return sum(values) / len(values) if values else float("nan")

    def last_of(key: str, rows: list[dict[str, float]]) -> float:
        values = [row[key] for row in rows if key in row]
        return values[-1] if values else float("nan")

    return {
        "seeds": [run.seed for run in runs],
        "start": [curve[0][1] for curve in curves],
        "final": [curve[-1][1] for curve in curves],
        "best": [max(a for _, a in curve) for curve in curves],
        "auc": [area_under_curve(curve) for curve in curves],
        "entropy": [last_of("actor/entropy", metrics[id(run)]) for run in runs],
        "clip_high": [mean_of("objective/clip_frac_high", metrics[id(run)]) for run in runs],
        "clip_low": [mean_of("objective/clip_frac_low", metrics[id(run)]) for run in runs],
        "wall": [run.wall_seconds for run in runs],
    }


def _fmt(values: list[float], digits: int = 3) -> str:
    mean, half = mean_ci(values)
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _markdown(summary: dict, runs: list[Run], failed: list[Run], metrics: dict) -> str:
    lines = [
        "# Comparison",
        "",
        "Mean ± half-width of the 95% Student-t interval over seeds. AUC: mean `eval/accuracy` over the run.",
        "",
        "| run | seeds | start acc | final acc | best acc | AUC | final entropy | clip high | clip low | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        if not s:
            lines.append(f"| {label} | 0 | — | — | — | — | — | — | — | — |")
            continue
        lines.append(
            f"| {label} | {len(s['seeds'])} | {_fmt(s['start'])} | {_fmt(s['final'])} | {_fmt(s['best'])} | "
            f"{_fmt(s['auc'])} | {_fmt(s['entropy'])} | {_fmt(s['clip_high'], 4)} | {_fmt(s['clip_low'], 4)} | "
            f"{_fmt(s['wall'], 0)} |"
        )
    lines += ["", f"Paired t-tests of final accuracy (same seeds; significant at p < {SIGNIFICANCE}):", ""]
    finals = {label: dict(zip(s["seeds"], s["final"], strict=True)) for label, s in summary.items() if s}
    tested = False
    for a, b in itertools.combinations(finals, 2):
        seeds = sorted(set(finals[a]) & set(finals[b]))
        if len(seeds) < 2:
            continue
        p = paired_t_test([finals[a][s] for s in seeds], [finals[b][s] for s in seeds])
        difference = sum(finals[a][s] - finals[b][s] for s in seeds) / len(seeds)
        verdict = "**significant**" if p < SIGNIFICANCE else "not significant"
        lines.append(f"- {a} - {b}: {difference:+.3f} (p = {p:.3f}, {verdict})")
        tested = True
    if not tested:
        lines.append("- (needs at least 2 seeds per run)")
    if failed:
        lines += ["", "Failed runs (see their log.txt):", ""]
        lines += [f"- {run.label} seed {run.seed}: {run.directory / 'log.txt'}" for run in failed]
    return "\n".join(lines) + "\n"


def _plot(path: Path, labels: list[str], runs: list[Run], metrics: dict[int, list[dict[str, float]]]) -> None:
    panels = []
    for key, title, unit in PANELS:
        lines = []
        for label in labels:
            series = [
                {row["step"]: row[key] for row in metrics[id(run)] if key in row} for run in runs if run.label == label
            ]
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if steps:
                stats = [mean_ci([s[step] for s in series]) for step in steps]
                lines.append((label, steps, [m for m, _ in stats], [h for _, h in stats]))
        panels.append((title, unit, lines))
    draw_panels(path, panels, "Mean over seeds with 95% confidence bands")
