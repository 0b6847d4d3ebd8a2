"""The report card of one run: ``report.md``, ``curves.png`` and ``summary.json`` in its ``output_dir``, so that a
run explains itself without a notebook (the habit is nanochat's), and a script reads its outcome without parsing
the console.

Everything is read back from the run directory, ``metrics.csv`` and ``data_report.json``, plus the resolved
config, so the same function reports a finished run, an interrupted one (whatever steps it logged) and one that
stopped before its first step. A metric that was never logged is left out, never an error: SFT has no reward, and
a run stopped before its first evaluation has no ``eval/accuracy``. Throughput is the median over the logged steps,
because the first step of a run also pays for warm-up. :func:`draw_panels` also draws ``comparison.png``.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from klear.data.readers import written
from klear.run.directory import RunDir, checkpoint_step
from klear.run.samples_log import answers_section

Series = tuple[str, list[float], list[float], list[float] | list[tuple[float, float]] | None]
"""One line of a panel: label, steps, values, and a band around it (or None): half-widths, or ``(low, high)`` per
step where it is not symmetric (``klear.compare`` clips the bands of bounded metrics to their range)."""

PANELS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "rl": [
        ("eval/accuracy", "fraction correct", ("eval/accuracy", "eval/accuracy/*")),
        ("reward (train samples)", "mean reward", ("reward/mean", "reward/raw_mean", "reward/mean/*")),
        ("actor/entropy", "nats / token", ("actor/entropy",)),
        ("clipped tokens", "fraction of tokens", ("objective/clip_frac_low", "objective/clip_frac_high")),
        ("actor/grad_norm", "L2 norm before clipping", ("actor/grad_norm",)),
        ("rollout/response_length", "tokens", ("rollout/response_length",)),
    ],
    "sft": [
        ("train/loss", "NLL / response token", ("train/loss",)),
        ("eval/accuracy", "fraction correct", ("eval/accuracy",)),
        ("train/grad_norm", "L2 norm before clipping", ("train/grad_norm",)),
    ],
}
"""Stage -> the panels of ``curves.png``: title, y-axis label, the metrics drawn together (``prefix/*``: every
logged metric under the prefix, such as the per-source ``eval/accuracy/<source>``)."""
AT_K = re.compile(r"eval/(pass|maj)_at_(\d+)")
"""An evaluation's pass@K and maj@K over all its problems (`klear.eval.in_training.evaluate`), not a set's."""
KEY_METRICS = {stage: [key for _, _, keys in panels for key in keys] for stage, panels in PANELS.items()}
"""Stage -> the metrics of the final-values table: those of the panels, and for RL the trainer-engine gap."""
KEY_METRICS["rl"].append("rollout/logprob_gap")
THROUGHPUT = {
    "rollout/gen_tokens_per_s": "generation",
    "actor/train_tokens_per_s": "training",
    "train/tokens_per_s": "training",
}
IDLE = {"timing/trainer_wait_s": "trainer waiting for rollouts", "timing/engine_wait_s": "rollout worker waiting"}
"""Idle times of asynchronous rollouts, reported per step and in total."""


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` with numbers as floats, empty cells left out; no file: no rows. Of a row cut short
    by a killed writer the cells it has are kept, and it is left out when it lost its ``step``."""
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        rows = [{key: float(value) for key, value in row.items() if value} for row in csv.DictReader(file)]
    return [row for row in rows if "step" in row]


def write_run_report(
    output_dir: Path, config: DictConfig, wall_seconds: float, status: str = "finished", first_step: int = 0
) -> list[Path]:
    """Write ``report.md``, ``summary.json`` and ``curves.png`` (when any panel has data) into ``output_dir``; return
    the files written. Each is written whole or not at all; a figure that cannot be written raises once ``report.md``
    and ``summary.json`` (without it) are.

    ``status`` says how the run ended (``finished``, ``interrupted at step N``, ``stopped: <reason>``);
    ``wall_seconds`` is the time of this invocation, which began at ``first_step`` (a resumed run's checkpoint).
    """
    output_dir = Path(output_dir)
    rows = read_metrics(output_dir / "metrics.csv")
    curves = output_dir / "curves.png"
    panels = [
        (title, unit, [_series(rows, key) for key in _expand(keys, rows) if any(key in row for row in rows)])
        for title, unit, keys in PANELS.get(config.stage, [])
    ]
    panels = [panel for panel in panels if panel[2]]
    failed = None
    if panels:
        try:
            written(curves, lambda path: draw_panels(path, panels, f"{config.stage.upper()} run {output_dir}"))
        except OSError as error:  # a full disk: report.md (a few kB) may still fit, without the figure
            failed, panels = error, []
    if not panels:
        curves.unlink(missing_ok=True)  # a figure of an earlier run in this directory would contradict the report
    from klear.runtime.threads import recorded

    threads = recorded()
    report, summary = output_dir / "report.md", output_dir / "summary.json"
    text = _markdown(output_dir, config, rows, wall_seconds, status, first_step, bool(panels), threads)
    written(report, lambda path: path.write_text(text))
    record = _summary(config, rows, wall_seconds, status, first_step, threads)
    record["best_metric"] = config.trainer.best_metric
    record["checkpoints"] = kept_checkpoints(output_dir, rows, config.trainer.best_metric)
    written(summary, lambda path: path.write_text(json.dumps(record, indent=2) + "\n"))
    if failed is not None:
        raise failed
    return [report, summary, curves] if panels else [report, summary]


def _summary(
    config: DictConfig, rows: list, wall: float, status: str, first_step: int, threads: dict | None
) -> dict[str, object]:
    """``summary.json``: how the run ended, its final metrics and the CPU threads it computed with, and why."""
    evals = accuracy_course(rows)
    best = max(evals, key=lambda item: item[1]) if evals else None
    return {
        "stage": config.stage,
        "status": status,
        "steps": steps_logged(rows),
        "max_steps": config.trainer.max_steps,
        "first_step": first_step,
        "wall_seconds": round(wall, 3),
        "cpu_threads": threads,
        "eval_accuracy": None
        if best is None
        else {"first": evals[0][1], "final": evals[-1][1], "best": best[1], "best_step": best[0]},
        "final": {key: value if math.isfinite(value) else None for key, value in _last_values(rows).items()},
    }


def _last_values(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's last logged value (evaluations and updates are logged in rows of their own), and its step."""
    last: dict[str, float] = {}
    for row in rows:
        last.update({key: value for key, value in row.items() if key != "step"})
    return {**last, "step": rows[-1]["step"]} if rows else last


def _expand(keys: tuple[str, ...] | list[str], rows: list[dict[str, float]]) -> list[str]:
    """``keys`` with each ``prefix/*`` replaced by the logged metrics under that prefix, sorted."""
    out = []
    for key in keys:
        if key.endswith("/*"):
            out += sorted({name for row in rows for name in row if name.startswith(key[:-1])})
        else:
            out.append(key)
    return out


def _series(rows: list[dict[str, float]], key: str) -> Series:
    return key, [row["step"] for row in rows if key in row], [row[key] for row in rows if key in row], None


def steps_logged(rows: list[dict[str, float]]) -> int:
    """Steps the logged rows show completed: a training row at step s completes s + 1, the closing evaluation
    (a row of ``eval/*`` only, logged at ``trainer.max_steps``) completes s."""
    done = [row["step"] if all(k.startswith("eval/") for k in row if k != "step") else row["step"] + 1 for row in rows]
    return int(max(done, default=0))


def _markdown(
    output_dir: Path,
    config: DictConfig,
    rows: list,
    wall: float,
    status: str,
    first_step: int,
    curves: bool,
    threads: dict | None = None,
) -> str:
    steps = steps_logged(rows)
    rate = (steps - first_step) / wall if wall > 0 else math.nan
    lines = [f"# {config.stage.upper()} run: `{output_dir}`", ""]
    lines += [f"**Status:** {status}; {steps} of {config.trainer.max_steps} steps, wall time {duration(wall)}"]
    lines[-1] += f" ({rate:.3g} steps/s{f', from step {first_step}' if first_step else ''}).\n"
    if not rows:
        lines += [
            "No metrics were logged (`metrics.csv` is missing or has no rows): the run stopped before its first "
            "step, so there are no curves.",
            "",
        ]
    data_report = read_data_report(output_dir / "data_report.json")
    lines += [*_accuracy(rows, data_report), ""]
    if curves:
        lines += ["![curves](curves.png)", ""]
    lines += ["## Settings", "", "| key | value |", "|---|---|"]
    lines += [f"| `{key}` | {value} |" for key, value in _settings(config)] + [""]
    throughput = [(name, key, [row[key] for row in rows if key in row]) for key, name in THROUGHPUT.items()]
    lines += ["## Speed", "", "| | |", "|---|---|", f"| wall time | {duration(wall)} |", f"| steps/s | {rate:.3g} |"]
    if threads is not None:
        lines.append(f"| CPU threads | {threads['threads']} of {threads['cores']} cores ({threads['reason']}) |")
    lines += [
        f"| {n} (`{k}`, median of {len(v)}) | {statistics.median(v):,.0f} tokens/s |" for n, k, v in throughput if v
    ]
    idle = [(name, key, [row[key] for row in rows if key in row]) for key, name in IDLE.items()]
    lines += [
        f"| {n} (`{k}`, median / total) | {statistics.median(v):.3f} s / {sum(v):.1f} s |" for n, k, v in idle if v
    ]
    lines += ["", "## Final values", ""]
    present = [key for key in _expand(KEY_METRICS.get(config.stage, []), rows) if any(key in row for row in rows)]
    if present:
        lines += ["| metric | first | final | at step | min | max |", "|---|---|---|---|---|---|"]
        for key in present:
            steps_of, values = _series(rows, key)[1:3]
            lines.append(
                f"| `{key}` | {_num(values[0])} | {_num(values[-1])} | {steps_of[-1]:.0f} | "
                f"{_num(min(values))} | {_num(max(values))} |"
            )
    missing = [key for key in KEY_METRICS.get(config.stage, []) if key not in present and not key.endswith("/*")]
    lines += ["", f"Not logged: {', '.join(f'`{key}`' for key in missing)}.", ""] if missing else [""]
    lines += _data(data_report) + answers_section(RunDir(output_dir).samples)
    lines += _files(output_dir, curves, rows, config.trainer.best_metric)
    return "\n".join(lines) + "\n"


def kept_checkpoints(
    output_dir: Path, rows: list[dict[str, float]], metric: str = "eval/accuracy"
) -> list[dict[str, Any]]:
    """``summary.json``'s ``checkpoints``: each checkpoint kept in ``output_dir`` (oldest first) with its step, the
    ``eval/accuracy`` of its weights and their ``score``, the ``metric`` that ranks them (``trainer.best_metric``;
    both null when its step was not evaluated): which to give ``--model``."""
    accuracy, scores = dict(accuracy_course(rows)), dict(accuracy_course(rows, metric))
    return [
        {"path": str(path), "step": step, "eval_accuracy": accuracy.get(step), "score": scores.get(step)}
        for path in RunDir(output_dir).saved_checkpoints()
        if (step := checkpoint_step(path)) is not None
    ]


def accuracy_course(rows: list[dict[str, float]], key: str = "eval/accuracy") -> list[tuple[int, float]]:
    """``[(step, eval/accuracy)]`` (or ``key``'s) of the logged evaluations, in order (what the report and the
    summary quote)."""
    return [(int(row["step"]), row[key]) for row in rows if key in row]


def read_data_report(path: Path) -> dict[str, Any]:
    """``data_report.json`` as written, or ``{}`` when the run wrote none."""
    return json.loads(path.read_text()) if path.is_file() else {}


def eval_set_names(data_report: dict[str, Any]) -> list[str]:
    """The names of ``data.eval``'s sets when it has several (``data_report.json``'s ``eval/<name>``), else []."""
    return [key.removeprefix("eval/") for key in data_report if key.startswith("eval/")]


def eval_set_courses(rows: list[dict[str, float]], data_report: dict[str, Any]) -> str | None:
    """Where each of ``data.eval``'s sets went, ``aime24 0.100 -> 0.200, aime25 ...`` (its ``eval/accuracy/<name>``
    first and last), when it has several; else None."""
    courses = []
    for name in eval_set_names(data_report):
        if points := accuracy_course(rows, f"eval/accuracy/{name}"):
            courses.append(f"{name} {points[0][1]:.3f} -> {points[-1][1]:.3f}")
    return ", ".join(courses) or None


def _accuracy(rows: list[dict[str, float]], data_report: dict[str, Any]) -> list[str]:
    points = accuracy_course(rows)
    if not points:
        return ["`eval/accuracy`: no evaluation was logged."]
    best_step, best = max(points, key=lambda point: point[1])  # the first step that reached the best
    (_, start), (end_step, end) = points[0], points[-1]
    lines = [
        f"**`eval/accuracy`:** {start:.3f} -> {end:.3f} ({end - start:+.3f}) at step {end_step:.0f}; "
        f"best {best:.3f} at step {best_step:.0f} ({len(points)} evaluation{'s' if len(points) > 1 else ''})."
    ]
    if courses := eval_set_courses(rows, data_report):
        lines += ["", f"**Each eval set** (`eval/accuracy/<set>`): {courses}."]
    if at_k := at_k_keys(rows):  # the evaluation sampled K > 1 answers per problem
        courses = []
        for key in at_k:
            points = accuracy_course(rows, key)
            courses.append(f"{at_k_name(key)} {points[0][1]:.3f} -> {points[-1][1]:.3f}")
        lines += ["", f"**pass@K and maj@K** (`eval/pass_at_K`, `eval/maj_at_K`): {', '.join(courses)}."]
    return lines


def at_k_keys(rows: Iterable[dict[str, float]]) -> list[str]:
    """The evaluation's pass@K and maj@K logged in ``rows`` (`AT_K`), pass@K before maj@K, by K."""

    def order(key: str) -> tuple[int, bool]:
        kind, k = AT_K.fullmatch(key).groups()
        return int(k), kind == "maj"

    return sorted({key for row in rows for key in row if AT_K.fullmatch(key)}, key=order)


def at_k_name(key: str) -> str:
    """``pass@4`` for ``eval/pass_at_4``."""
    kind, k = AT_K.fullmatch(key).groups()
    return f"{kind}@{k}"


def _settings(config: DictConfig) -> list[tuple[str, object]]:
    common = [("model.path", config.model.path), ("stage", config.stage), ("seed", config.seed)]
    lora = config.model.get("lora")
    if lora is not None:  # what LoRA trains: its rank, scale and layers
        targets = ",".join(lora.target_modules)
        common.insert(1, ("model.lora", f"r={lora.r}, alpha={lora.alpha:g}, target_modules={targets}"))
    if config.stage == "sft":
        data, epochs, steps = config.data, config.trainer.get("epochs"), config.trainer.max_steps
        steps = f"{steps} ({epochs:g} passes over data.train)" if epochs else steps
        return [
            *common,
            ("trainer.max_steps", steps),
            ("data.batch_size", data.batch_size),
            ("data.max_length", data.max_length),
            ("data.batching", data.batching),
            ("optim.lr", config.optim.lr),
        ]
    from klear.objectives import objective_defaults

    options = {key: value for key, value in config.objective.items() if key != "name"}
    hyperparameters = {**objective_defaults(config.objective.name), **options}
    rollout, algorithm = config.rollout, config.algorithm
    updates = math.ceil(rollout.prompts_per_step / algorithm.mini_batch_prompts) * algorithm.epochs
    return [
        *common,
        ("objective", f"{config.objective.name} ({', '.join(f'{k}={v}' for k, v in hyperparameters.items())})"),
        ("trainer.max_steps", config.trainer.max_steps),
        (
            "rollout.prompts_per_step x rollout.group_size",
            f"{rollout.prompts_per_step} x {rollout.group_size} = {rollout.prompts_per_step * rollout.group_size} "
            "responses / step",
        ),
        ("algorithm.mini_batch_prompts", f"{algorithm.mini_batch_prompts} (up to {updates} updates / step)"),
        ("algorithm.epochs", algorithm.epochs),
        ("optim.lr", config.optim.lr),
        *(
            [("rollout.max_staleness", f"{rollout.max_staleness} (asynchronous rollouts)")]
            if rollout.max_staleness
            else []
        ),
    ]


def _data(report: dict[str, Any]) -> list[str]:
    if not report:
        return []
    lines = ["## Data", "", "| split | source | rows | used | skipped |", "|---|---|---|---|---|"]
    for split, source in report.items():
        used = source.get("problems", source.get("examples", "—"))
        lines.append(
            f"| {split} | `{source.get('source')}` | {source.get('rows', '—')} | {used} | {source.get('skipped', 0)} |"
        )
    if any(source.get("skipped") for source in report.values()):
        lines += ["", "The skipped rows are listed by file and line in [data_report.json](data_report.json)."]
    if (flags := eval_flags(report)) is not None:
        lines += ["", f"Every prompt was put in a prompt format; `klear.eval` asks as training did with `{flags}`."]
    return [*lines, ""]


def eval_flags(data_report: dict[str, Any]) -> str | None:
    """The ``klear.eval`` flags of the prompt format a run's problems were put in (``data_report.json``), or None
    when they were given as their rows give them."""
    from klear.data.prompts import PromptFormat

    recorded = next((source["prompt_format"] for source in data_report.values() if "prompt_format" in source), None)
    return None if recorded is None else PromptFormat.described(recorded).flags()


def _files(output_dir: Path, curves: bool, rows: list[dict[str, float]], metric: str) -> list[str]:
    files = [
        ("curves.png", curves),
        ("metrics.csv", (output_dir / "metrics.csv").is_file()),
        ("config.yaml", (output_dir / "config.yaml").is_file()),
        ("samples.jsonl", (output_dir / "samples.jsonl").is_file()),
    ]
    links = [f"[{name}]({name})" for name, present in files if present]
    model = "[hf/](hf/) (the final model)" if (output_dir / "hf").is_dir() else "no `hf/` (written when a run ends)"
    if (output_dir / "adapter").is_dir():
        model += ", [adapter/](adapter/) (its LoRA adapters; hf/ is merged)"
    lines = ["## Files", "", f"{', '.join(links)}; {model}."]
    kept = [
        f"[{Path(entry['path']).name}](checkpoints/{Path(entry['path']).name}){_scores(entry, metric)}"
        for entry in kept_checkpoints(output_dir, rows, metric)
    ]
    if kept:
        lines += ["", f"Checkpoints kept, each a model for `--model` and `model.path`: {', '.join(kept)}."]
    return lines


def _scores(checkpoint: dict[str, Any], metric: str) -> str:
    """`` (`eval/accuracy` 0.500)`` of a kept checkpoint, with its ``metric`` when that is another; "" unscored."""
    scores = [("eval/accuracy", checkpoint["eval_accuracy"]), (metric, checkpoint["score"])]
    shown = [f"`{name}` {value:.3f}" for name, value in dict(scores).items() if value is not None]
    return f" ({', '.join(shown)})" if shown else ""


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def duration(seconds: float) -> str:
    """``3 min 8 s``, ``1 h 05 min``, ``12.3 s``."""
    minutes, rest = divmod(round(seconds), 60)
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def label_colours(labels: list[str]) -> dict[str, object]:
    """A distinct colour per label: matplotlib's 10-colour cycle, or ``tab20`` beyond 10 labels (and
    ``tab20b``/``tab20c`` after that), so that no two labels of one figure share a colour up to 60."""
    import matplotlib

    if len(labels) <= 10:
        return {label: f"C{i}" for i, label in enumerate(labels)}
    palette = [colour for name in ("tab20", "tab20b", "tab20c") for colour in matplotlib.colormaps[name].colors]
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


LEGEND_INSIDE = 3
"""The most lines a panel's legend names inside its axes (where it covers little); more go below the panel."""


def draw_panels(path: Path, panels: list[tuple[str, str, list[Series]]], title: str) -> None:
    """Draw ``panels`` (title, y-axis label, series) over ``step``, three to a row, into the PNG ``path``.

    A label keeps its colour in every panel. When every panel with data holds the same labels (runs compared), one
    legend serves the figure; otherwise a panel with several lines has its own (below it past `LEGEND_INSIDE`
    lines), and its later lines are dashed.
    Series of up to 25 points get markers, so that a few evaluations read as points rather than a trend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    drawn = [tuple(s[0] for s in series) for _, _, series in panels if series]
    shared = len(drawn) > 1 and len(set(drawn)) == 1
    # A legend of more lines than an axis holds without covering them goes below its panel, two labels a line.
    below = [0 if shared or len(panel[2]) <= LEGEND_INSIDE else math.ceil(len(panel[2]) / 2) for panel in panels]
    room = sum(max(below[row * columns : (row + 1) * columns]) * 0.2 for row in range(rows))
    height = 3.6 * rows + 0.6 + room
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, height), squeeze=False)
    colours = label_colours(list(dict.fromkeys(s[0] for p in panels for s in p[2])))
    for axis, (name, unit, series) in zip(axes.reshape(-1), panels, strict=False):
        for index, (label, steps, values, half) in enumerate(series):
            style = {"color": colours[label], "marker": "o" if len(steps) <= 25 else None, "markersize": 3.5}
            # Within a run the later lines are dashed, so that one equal to the first (raw reward) still shows.
            linestyle = "-" if shared else ("-", "--", ":")[index % 3]
            axis.plot(steps, values, label=label, linewidth=1.6, linestyle=linestyle, **style)
            if half is not None:
                band = [h if isinstance(h, tuple) else (v - h, v + h) for v, h in zip(values, half, strict=True)]
                axis.fill_between(steps, *zip(*band, strict=True), color=colours[label], alpha=0.2)
        axis.set(title=name, xlabel="step", ylabel=unit)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        axis.grid(alpha=0.3)
        if len(series) > LEGEND_INSIDE and not shared:
            axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        elif len(series) > 1 and not shared:
            axis.legend(fontsize=8)
    for axis in axes.reshape(-1)[len(panels) :]:
        axis.set_visible(False)
    if shared:
        first = next(i for i, panel in enumerate(panels) if panel[2])
        handles, labels = axes.reshape(-1)[first].get_legend_handles_labels()
        figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=9)
    figure.suptitle(title)
    # The title's line and the shared legend's keep their own strip (half an inch each), whatever the height.
    figure.tight_layout(rect=(0, 0.5 / height if shared else 0, 1, 1 - 0.4 / height))
    figure.savefig(path, dpi=100)
    plt.close(figure)
