"""The reports of a comparison: every run's metrics in one CSV, a summary with confidence intervals and paired
verdicts against a baseline, and a figure of the curves and the diagnostics with their bands.

Per label (objective or objective+variant), over seeds: start, final and best ``eval/accuracy``, the area under the
accuracy curve (the mean accuracy over the steps of the run, trapezoid rule, so early learners score higher) and
the drop (final minus best, 0 for a run that ends at its best), each as a mean with its 95% Student-t interval; when
``data.eval`` names several sets, each set's final ``eval/accuracy/<set>`` too; when the evaluation samples K > 1
answers per problem, the final ``eval/pass_at_K`` and (on math) ``eval/maj_at_K``: any of K answers right, the most
given of K answers right, which tell an objective that keeps the policy exploring from one that sharpens it.
Each label other than the baseline is compared with it on each of the three (and on the final pass@K and maj@K,
when logged), pairing runs by seed (runs with the same seed share their step-0 rollouts, which is what makes pairing
right): the mean paired difference, its interval, and the paired t-test's p-value Holm-corrected over the labels
compared, with a one-line verdict, and for a difference not yet significant the number of seeds it would need
(`klear.eval.stats.seeds_needed`).
A second table holds the diagnostics (`DIAGNOSTICS`) that explain the differences: what the objectives do with
the tokens that left the clip band.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable
from pathlib import Path

from klear.compare.runs import Run
from klear.eval.stats import holm, mean_ci, paired_difference, seeds_needed
from klear.run.report import (
    AT_K,
    Series,
    at_k_keys,
    at_k_name,
    draw_panels,
    eval_set_names,
    read_data_report,
    read_metrics,
)
from klear.run.samples_log import answer_lines, last_evaluated, problem_lines

PANELS = [
    ("eval/accuracy", "eval accuracy", "fraction correct"),
    ("reward/mean", "reward (train samples)", "mean reward"),
    ("rollout/response_length", "response length", "tokens"),
    ("actor/entropy_pos", "entropy, A>0 responses", "nats / token"),
    ("actor/entropy_neg", "entropy, A<0 responses", "nats / token"),
    ("actor/grad_norm", "grad norm", "L2 norm before clipping"),
    ("objective/above_band_pos", "A>0 tokens above band", "fraction of tokens"),
    ("objective/below_band_neg", "A<0 tokens below band", "fraction of tokens"),
    ("objective/grad_share_above_pos", "grad share, A>0 above band", "share of sum |dL/dlogp|"),
    ("objective/grad_share_below_neg", "grad share, A<0 below band", "share of sum |dL/dlogp|"),
    ("objective/approx_kl", "approx KL to rollout policy", "nats / token"),
    ("objective/clip_frac_high", "clip fraction high", "fraction of tokens"),
]
"""Panels of ``comparison.png``: metric, title, y-axis label."""
RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(
        [
            "eval/accuracy",
            "objective/above_band_pos",
            "objective/below_band_neg",
            "objective/grad_share_above_pos",
            "objective/grad_share_below_neg",
            "objective/clip_frac_high",
        ],
        (0.0, 1.0),
    ),
    **dict.fromkeys(
        ["rollout/response_length", "actor/entropy_pos", "actor/entropy_neg", "actor/grad_norm", "objective/approx_kl"],
        (0.0, math.inf),
    ),  # approx KL is the k3 estimator, ratio - 1 - log(ratio) >= 0
}
"""The values a panel's metric can take: its band in ``comparison.png`` is clipped to them (a Student-t interval
over a few seeds reaches below 0 for a fraction near 0). ``reward/mean`` has none: its range is the reward's, and a
format or length penalty takes it below 0."""
OUTCOMES = [("final", "final accuracy"), ("auc", "AUC"), ("drop", "final - best")]
"""The per-seed outcomes compared against the baseline, each with its own Holm family."""
DIAGNOSTICS = [
    ("objective/clip_frac_high", "clip high"),
    ("objective/clip_frac_low", "clip low"),
    ("objective/above_band_pos", "A>0 above band"),
    ("objective/below_band_neg", "A<0 below band"),
    ("objective/grad_share_above_pos", "grad share A>0 above"),
    ("objective/grad_share_below_neg", "grad share A<0 below"),
    ("objective/approx_kl", "approx KL"),
]
"""Diagnostics averaged over each run's steps, then over seeds: metric, column title."""
FINAL_DIAGNOSTICS = [
    ("actor/entropy", "final entropy"),
    ("actor/entropy_pos", "final entropy A>0"),
    ("actor/entropy_neg", "final entropy A<0"),
    ("rollout/response_length", "final length"),
]
"""Diagnostics at each run's last logged step, then over seeds."""
SIGNIFICANCE = 0.05
POWER = 0.8


def read_run(run: Run) -> list[dict[str, float]]:
    """Rows of a run's metrics.csv with numbers as floats (missing values left out)."""
    return read_metrics(run.directory / "metrics.csv")


def write_reports(output: Path, runs: list[Run], failed: list[Run], baseline: str | None = None) -> list[Path]:
    """Write the reports of the finished runs; returns the files written. ``baseline`` is the label the others
    are compared with (default: the first). Without a finished run there are no curves: ``comparison.png`` is not
    drawn (and one left by an earlier comparison is removed, so that no figure contradicts the table)."""
    output.mkdir(parents=True, exist_ok=True)
    done = [run for run in runs if run.finished]
    metrics = {id(run): read_run(run) for run in done}
    _write_csv(output / "comparison.csv", done, metrics)
    labels = list(dict.fromkeys(run.label for run in runs))
    summary = {label: _summarise([r for r in done if r.label == label], metrics) for label in labels}
    markdown = _markdown(summary, failed, baseline or labels[0]) + "\n".join(answers_section(labels, done))
    (output / "comparison.md").write_text(markdown)
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
    """Per-seed values of a label's runs (lists in seed order; NaN where a run never logged the metric)."""
    if not runs:
        return {}
    curves = [accuracy_curve(metrics[id(run)]) for run in runs]

    def mean_of(key: str, rows: list[dict[str, float]]) -> float:
        values = [row[key] for row in rows if key in row]
        return sum(values) / len(values) if values else float("nan")

    def last_of(key: str, rows: list[dict[str, float]]) -> float:
        values = [row[key] for row in rows if key in row]
        return values[-1] if values else float("nan")

    summary: dict[str, object] = {
        "seeds": [run.seed for run in runs],
        "start": [curve[0][1] for curve in curves],
        "final": [curve[-1][1] for curve in curves],
        "best": [max(a for _, a in curve) for curve in curves],
        "auc": [area_under_curve(curve) for curve in curves],
        "drop": [curve[-1][1] - max(a for _, a in curve) for curve in curves],
        "wall": [run.wall_seconds for run in runs],
        "sets": {
            name: [last_of(f"eval/accuracy/{name}", metrics[id(run)]) for run in runs]
            for name in dict.fromkeys(
                name for run in runs for name in eval_set_names(read_data_report(run.directory / "data_report.json"))
            )
        },
    }
    summary["at_k"] = at_k_keys(row for run in runs for row in metrics[id(run)])
    for key in summary["at_k"]:
        summary[key] = [last_of(key, metrics[id(run)]) for run in runs]
    for key, _ in DIAGNOSTICS:
        summary[key] = [mean_of(key, metrics[id(run)]) for run in runs]
    for key, _ in FINAL_DIAGNOSTICS:
        summary[key] = [last_of(key, metrics[id(run)]) for run in runs]
    return summary


def _fmt(values: list[float], digits: int = 3, style: str = "f") -> str:
    """Mean ± the interval's half-width: ``digits`` decimals (``style="f"``), or significant digits in scientific
    notation (``"e"``: the diagnostics, whose token shares can be 1e-5)."""
    values = [v for v in values if v == v]  # NaN: a run that never logged the metric
    if not values:
        return "—"
    mean, half = mean_ci(values)
    return f"{mean:.{digits}{style}} ± {half:.{digits}{style}}" if len(values) > 1 else f"{mean:.{digits}{style}}"


def verdicts(summary: dict[str, dict], baseline: str, outcome: str) -> list[str]:
    """One line per label against ``baseline`` on ``outcome`` (a key of `OUTCOMES`, or a final pass@K / maj@K), paired
    by seed over the seeds both logged it for, p-values Holm-corrected over the labels compared."""
    if outcome not in summary[baseline]:
        return []
    base = dict(zip(summary[baseline]["seeds"], summary[baseline][outcome], strict=True))
    tests = []
    for label, s in summary.items():
        if label == baseline or outcome not in s:
            continue
        values = dict(zip(s["seeds"], s[outcome], strict=True))
        seeds = sorted(seed for seed in set(values) & set(base) if not math.isnan(values[seed] - base[seed]))
        if len(seeds) >= 2:
            a, b = [values[seed] for seed in seeds], [base[seed] for seed in seeds]
            tests.append((label, seeds, [x - y for x, y in zip(a, b, strict=True)], *paired_difference(a, b)))
    adjusted = holm([test[-1] for test in tests])
    lines = []
    for (label, seeds, differences, mean, half, _), p in zip(tests, adjusted, strict=True):
        head = f"- {label} - {baseline}: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}], p_holm = {p:.3f}"
        if p < SIGNIFICANCE:
            lines.append(f"{head}: **{label} {'higher' if mean > 0 else 'lower'}**")
        else:
            needed = seeds_needed(differences, SIGNIFICANCE, POWER)
            power = f"about {needed} seeds for a difference this size" if needed < 10_000 else "over 10000 seeds"
            lines.append(f"{head}: not distinguishable at {len(seeds)} seeds ({power})")
    return lines


def _label_table(summary: dict, columns: list[str], cells: Callable[[dict], list[str]]) -> list[str]:
    """A markdown table with a row per label that has finished runs: ``run`` and ``columns``, ``cells(summary)``."""
    rows = [f"| {label} | " + " | ".join(cells(s)) + " |" for label, s in summary.items() if s]
    return ["| run | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns), *rows]


def answers_section(labels: list[str], done: list[Run]) -> list[str]:
    """comparison.md's "Answers": for the first seed a label finished, its first answer to the first held-out problem
    at the last evaluation (each run's ``samples.jsonl``), label by label; [] when no run kept answers."""
    shown = []
    for label in labels:
        for run in sorted((run for run in done if run.label == label), key=lambda run: run.seed):
            record = last_evaluated(run.directory / "samples.jsonl")
            if record is not None:
                shown.append((label, run.seed, record))
                break
    if not shown:
        return []
    lines = [
        "",
        "## Answers",
        "",
        "The first held-out problem and each label's first answer to it at the last evaluation (its run's "
        "`samples.jsonl`, the lowest seed that kept one):",
    ]
    problem = None
    for label, seed, record in shown:
        if record.get("problem") != problem:  # the same problem for every label unless a variant changed data.eval
            problem = record.get("problem")
            lines += ["", *problem_lines(record)]
        lines += answer_lines(record, f"{label} (seed {seed}, step {record.get('step')})")
    return [*lines, ""]


def _markdown(summary: dict, failed: list[Run], baseline: str) -> str:
    lines = [
        "# Comparison",
        "",
        "Mean ± half-width of the 95% Student-t interval over seeds. AUC: mean `eval/accuracy` over the run; "
        "drop: final minus best accuracy (0 for a run that ends at its best).",
        "",
        "| run | seeds | start acc | final acc | best acc | AUC | final - best | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        if not s:
            lines.append(f"| {label} | 0 | — | — | — | — | — | — |")
            continue
        lines.append(
            f"| {label} | {len(s['seeds'])} | {_fmt(s['start'])} | {_fmt(s['final'])} | {_fmt(s['best'])} | "
            f"{_fmt(s['auc'])} | {_fmt(s['drop'])} | {_fmt(s['wall'], 0)} |"
        )
    sets = list(dict.fromkeys(name for s in summary.values() if s for name in s["sets"]))
    if sets:  # data.eval named several sets: each one's final accuracy
        lines += ["", "Final accuracy of each eval set (`eval/accuracy/<set>` at the last evaluation):", ""]
        lines += _label_table(summary, sets, lambda s: [_fmt(s["sets"].get(name, [])) for name in sets])
    at_k = list(dict.fromkeys(key for s in summary.values() if s for key in s["at_k"]))
    if at_k:  # the evaluation sampled K > 1 answers per problem
        lines += [
            "",
            "Final pass@K and maj@K (`eval/pass_at_K`, `eval/maj_at_K` at the last evaluation): a problem with any of "
            "its K answers right, and one whose most given answer is right.",
            "",
        ]
        lines += _label_table(
            summary, [f"final {at_k_name(key)}" for key in at_k], lambda s: [_fmt(s.get(key, [])) for key in at_k]
        )
    lines += [
        "",
        "Diagnostics: token shares and gradient shares are means over each run's steps (the tokens that left the "
        "clip band in the direction their advantage pushes, and their share of the update's sum of |dL/dlogp|); "
        "entropies and response length at the last step.",
        "",
    ]
    lines += _label_table(
        summary,
        [name for _, name in DIAGNOSTICS + FINAL_DIAGNOSTICS],
        lambda s: [_fmt(s[key], 1, "e") for key, _ in DIAGNOSTICS] + [_fmt(s[key]) for key, _ in FINAL_DIAGNOSTICS],
    )
    lines += [
        "",
        f"## Against the baseline, {baseline}",
        "",
        f"Paired by seed: mean difference [95% interval], paired t-test p-value Holm-corrected over the "
        f"{max(len(summary) - 1, 0)} labels compared; significant at p_holm < {SIGNIFICANCE}. For a difference "
        f"that is not, the seeds a paired t-test would need to detect it at alpha {SIGNIFICANCE} with "
        f"{POWER:.0%} power, if the seed-to-seed spread stays as observed (before the correction).",
    ]
    if not summary.get(baseline):
        lines += ["", f"- (no finished run of the baseline {baseline})"]
    else:
        for outcome, name in [*OUTCOMES, *((key, f"final {at_k_name(key)}") for key in at_k)]:
            found = verdicts(summary, baseline, outcome)
            lines += ["", f"{name}:", ""] + (found or ["- (needs at least 2 seeds shared with the baseline)"])
    if failed:
        lines += ["", "Failed runs (see their log.txt):", ""]
        lines += [f"- {run.label} seed {run.seed}: {run.directory / 'log.txt'}" for run in failed]
    return "\n".join(lines) + "\n"


SMOOTHING = 5
"""Steps of the centred moving average that per-step training metrics are drawn with (each seed's series, before
the mean over seeds); evaluations are drawn as they are."""


def smoothed(series: dict[float, float], window: int = SMOOTHING) -> dict[float, float]:
    """``series`` (step -> value) as a centred moving average over ``window`` consecutive logged steps (fewer at
    the ends)."""
    steps = sorted(series)
    half = window // 2
    result = {}
    for i, step in enumerate(steps):
        near = steps[max(0, i - half) : i + half + 1]
        result[step] = sum(series[s] for s in near) / len(near)
    return result


def _plot(path: Path, labels: list[str], runs: list[Run], metrics: dict[int, list[dict[str, float]]]) -> None:
    panels = comparison_panels(labels, runs, metrics)
    draw_panels(path, panels, "Mean over seeds with 95% confidence bands (clipped to each metric's range)")


def comparison_panels(
    labels: list[str], runs: list[Run], metrics: dict[int, list[dict[str, float]]]
) -> list[tuple[str, str, list[Series]]]:
    """The panels of ``comparison.png`` (`PANELS`, with the evaluation's pass@K and maj@K after its accuracy where
    they were logged): per label, the mean over seeds at the steps every seed logged, and its 95% band as
    ``(low, high)``, clipped to the metric's `RANGES` (pass@K and maj@K: [0, 1])."""
    at_k = [
        (key, f"eval {at_k_name(key)}", "fraction of problems")
        for key in at_k_keys(row for run in runs for row in metrics[id(run)])
    ]
    panels = []
    for key, title, unit in [PANELS[0], *at_k, *PANELS[1:]]:
        lines = []
        if not key.startswith("eval/"):
            title = f"{title} ({SMOOTHING}-step mean)"
        for label in labels:
            series = [
                {row["step"]: row[key] for row in metrics[id(run)] if key in row} for run in runs if run.label == label
            ]
            if not key.startswith("eval/"):
                series = [smoothed(s) for s in series]
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if steps:
                stats = [mean_ci([s[step] for s in series]) for step in steps]
                low, high = RANGES.get(key, (0.0, 1.0) if AT_K.fullmatch(key) else (-math.inf, math.inf))
                band = [(max(m - h, low), min(m + h, high)) for m, h in stats]
                lines.append((label, steps, [m for m, _ in stats], band))
        panels.append((title, unit, lines))
    return panels
