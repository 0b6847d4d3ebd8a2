"""The run report: numbers in ``report.md`` read back from small hand-written ``metrics.csv`` files (finished,
interrupted, missing metrics, no rows, a row cut short), the figure's panels, and one real short RL run."""

import csv
import json

import pytest

from klear.config.load import load_config
from klear.fit import main
from klear.run.report import read_metrics, steps_logged, write_run_report
from tests.runs import RL_SHORT

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() (a training run)

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(path, rows: list[dict[str, float]]) -> None:
    """``metrics.csv`` in the logger's layout: sorted columns, empty cells for metrics not logged at a step."""
    keys = sorted({key for row in rows for key in row})
    with (path / "metrics.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def rl_config(tmp_path, *overrides: str):
    return load_config("configs/rl.yaml", [f"output_dir={tmp_path}", "trainer.max_steps=4", *overrides])


def test_rl_report_has_accuracy_speed_final_values_and_settings(tmp_path):
    # eval at 0, 2 and the closing one at 4: start 0.25, best 0.5 at step 2, end 0.375.
    accuracy = {0: 0.25, 2: 0.5}
    rows = [
        {
            "step": step,
            "reward/mean": 0.1 * step,
            "objective/clip_frac_low": 0.01,
            "objective/clip_frac_high": 0.02,
            "actor/entropy": 0.5,
            "actor/grad_norm": 1.5,
            "rollout/response_length": 40 + step,
            "rollout/gen_tokens_per_s": [100, 1000, 1200, 1100][step],  # median 1050: the warm-up step is not it
            **(
                {"eval/accuracy": accuracy[step], "eval/pass_at_4": 0.5, "eval/maj_at_4": 0.25}
                if step in accuracy
                else {}
            ),
        }
        for step in range(4)
    ]
    write_metrics(tmp_path, [*rows, {"step": 4, "eval/accuracy": 0.375, "eval/pass_at_4": 0.75, "eval/maj_at_4": 0.5}])
    written = write_run_report(tmp_path, rl_config(tmp_path, "objective.eps_high=0.3"), wall_seconds=8.0)

    assert [path.name for path in written] == ["report.md", "summary.json", "curves.png"]
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["stage"], summary["status"], summary["steps"], summary["max_steps"]) == ("rl", "finished", 4, 4)
    assert summary["eval_accuracy"]["final"] == 0.375 and summary["final"]["step"] == 4
    assert summary["final"]["rollout/gen_tokens_per_s"] == 1100  # each metric's last value, not the last row's
    report = (tmp_path / "report.md").read_text()
    assert report.startswith(f"# RL run: `{tmp_path}`")
    assert "**Status:** finished; 4 of 4 steps, wall time 8.0 s (0.5 steps/s)." in report
    assert "0.250 -> 0.375 (+0.125) at step 4; best 0.500 at step 2 (3 evaluations)" in report
    assert (
        "**pass@K and maj@K** (`eval/pass_at_K`, `eval/maj_at_K`): pass@4 0.500 -> 0.750, maj@4 0.250 -> 0.500."
        in report
    )
    assert "| `objective` | gppo (eps_low=0.2, eps_high=0.3," in report  # defaults with the override
    assert "| `rollout.prompts_per_step x rollout.group_size` | 16 x 8 = 128 responses / step |" in report
    assert "| `algorithm.mini_batch_prompts` | 4 (up to 4 updates / step) |" in report
    assert "| generation (`rollout/gen_tokens_per_s`, median of 4) | 1,050 tokens/s |" in report
    assert "| `reward/mean` | 0 | 0.3 | 3 | 0 | 0.3 |" in report
    assert "| `rollout/response_length` | 40 | 43 | 3 | 40 | 43 |" in report
    assert "Not logged: `reward/raw_mean`, `rollout/logprob_gap`." in report
    assert "[curves.png](curves.png), [metrics.csv](metrics.csv)" in report and "no `hf/`" in report


def test_interrupted_sft_run_without_eval_reports_what_it_logged(tmp_path):
    write_metrics(
        tmp_path, [{"step": step, "train/loss": 3.0 - step, "train/tokens_per_s": 500.0} for step in range(3)]
    )
    (tmp_path / "data_report.json").write_text(
        json.dumps({"train": {"source": "a.jsonl", "rows": 10, "examples": 8, "skipped": 2}})
    )
    (tmp_path / "hf").mkdir()
    config = load_config("configs/sft.yaml", [f"output_dir={tmp_path}", "trainer.max_steps=10"])
    written = write_run_report(tmp_path, config, wall_seconds=150.0, status="interrupted at step 3")

    assert [path.name for path in written] == ["report.md", "summary.json", "curves.png"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["eval_accuracy"], summary["wall_seconds"]) == (
        "interrupted at step 3",
        None,
        150.0,
    )
    report = (tmp_path / "report.md").read_text()
    assert "**Status:** interrupted at step 3; 3 of 10 steps, wall time 2 min 30 s (0.02 steps/s)." in report
    assert "`eval/accuracy`: no evaluation was logged." in report
    assert "| `train/loss` | 3 | 1 | 2 | 1 | 3 |" in report
    assert "Not logged: `eval/accuracy`, `train/grad_norm`." in report
    assert "| `data.batch_size` | 16 |" in report and "| `data.max_length` | 256 |" in report
    assert "| training (`train/tokens_per_s`, median of 3) | 500 tokens/s |" in report
    assert "| train | `a.jsonl` | 10 | 8 | 2 |" in report and "[data_report.json](data_report.json)" in report
    assert "[hf/](hf/) (the final model)" in report
    assert "objective" not in report and "reward" not in report


def test_run_without_metrics_writes_report_and_no_figure(tmp_path):
    (tmp_path / "curves.png").write_bytes(PNG)  # left by an earlier run in this directory
    write_metrics(tmp_path, [])
    written = write_run_report(tmp_path, rl_config(tmp_path), wall_seconds=3.0, status="stopped: no data")

    assert written == [tmp_path / "report.md", tmp_path / "summary.json"] and not (tmp_path / "curves.png").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["final"] == {}
    report = (tmp_path / "report.md").read_text()
    assert "**Status:** stopped: no data; 0 of 4 steps" in report
    assert "No metrics were logged" in report and "curves.png" not in report
    (tmp_path / "metrics.csv").unlink()
    assert write_run_report(tmp_path, rl_config(tmp_path), wall_seconds=3.0) == [
        tmp_path / "report.md",
        tmp_path / "summary.json",
    ]


def test_row_cut_short_and_resumed_rate(tmp_path):
    write_metrics(
        tmp_path, [{"step": 0, "actor/entropy": 2.0, "eval/accuracy": 0.1}, {"step": 1, "actor/entropy": 1.0}]
    )
    with (tmp_path / "metrics.csv").open("a") as file:
        file.write("2,,2\n0.5")  # a row with an empty cell, then one a killed writer cut before its step
    rows = read_metrics(tmp_path / "metrics.csv")
    assert rows[-1] == {"step": 2.0, "actor/entropy": 2.0} and len(rows) == 3
    assert steps_logged(rows) == 3
    assert steps_logged([{"step": 0, "eval/accuracy": 0.1, "train/loss": 1}, {"step": 4, "eval/accuracy": 0.2}]) == 4
    write_run_report(tmp_path, rl_config(tmp_path), wall_seconds=4.0, status="interrupted at step 3", first_step=1)
    report = (tmp_path / "report.md").read_text()
    assert "3 of 4 steps, wall time 4.0 s (0.5 steps/s, from step 1)." in report
    assert "0.100 -> 0.100 (+0.000) at step 0; best 0.100 at step 0 (1 evaluation)" in report


def test_report_of_a_real_short_rl_run(tmp_path):
    assert main(["--config", "configs/rl.yaml", f"output_dir={tmp_path}", *RL_SHORT, "trainer.max_steps=2"]) == 0
    config = load_config(tmp_path / "config.yaml")
    write_run_report(tmp_path, config, wall_seconds=10.0)
    accuracy = [row["eval/accuracy"] for row in read_metrics(tmp_path / "metrics.csv") if "eval/accuracy" in row]
    report = (tmp_path / "report.md").read_text()
    assert len(accuracy) == 2 and f"{accuracy[0]:.3f} -> {accuracy[-1]:.3f}" in report
    assert "2 of 2 steps" in report and "[hf/](hf/)" in report and "Not logged" not in report
    assert "| `rollout.prompts_per_step x rollout.group_size` | 4 x 4 = 16 responses / step |" in report
    assert (tmp_path / "curves.png").stat().st_size > 20_000


def test_a_legend_of_more_lines_than_an_axis_holds_goes_below_its_panel(tmp_path, monkeypatch):
    """A reward panel of four sets' lines and the run's own keeps its legend off the points, below the panel; a panel
    of two lines keeps its legend inside."""
    import matplotlib.pyplot as plt

    from klear.run.report import LEGEND_INSIDE, draw_panels

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at it
    steps = [0.0, 1.0, 2.0]
    many = [(f"reward/mean/{name}", steps, [0.1, 0.5, 0.9], None) for name in ("a", "b", "c", "d", "e")]
    two = [(name, steps, [0.2, 0.2, 0.2], None) for name in ("objective/clip_frac_low", "objective/clip_frac_high")]
    draw_panels(tmp_path / "curves.png", [("reward", "mean reward", many), ("clipped", "fraction", two)], "run")
    (figure,) = figures
    figure.canvas.draw()
    reward, clipped = figure.axes[:2]
    assert len(many) > LEGEND_INSIDE >= len(two)
    below = reward.get_legend().get_window_extent()
    assert below.y1 < reward.get_window_extent().y0  # under the panel, clear of its points
    inside, axis = clipped.get_legend().get_window_extent(), clipped.get_window_extent()
    assert axis.y0 <= inside.y0 and inside.y1 <= axis.y1
    assert (tmp_path / "curves.png").stat().st_size > 0
